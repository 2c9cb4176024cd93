// Package authn authenticates callers of the CA and the xDS server by their
// Kubernetes service-account token (docs/wire-contract.md §6.3): a
// TokenReview with the CA's audiences, in the cluster the caller names in its
// clusterid header. It knows nothing of gRPC; the servers pass it the bearer
// token and the header.
//
// TokenReviews cost the API server, and a caller can make one with any
// string, so they are budgeted: positive answers are cached briefly,
// rejections for a shorter while, concurrent lookups of one token share one
// review, and reviews of tokens not in the cache are rate limited per
// cluster. A token the cache holds as valid never waits for the budget; a
// review the budget cannot afford within a short wait is refused with
// ErrThrottled, without asking the API server.
//
// An Authenticator is safe for concurrent use.
package authn

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/canopy-mesh/canopy/internal/ratewait"
)

// Reasons authentication fails; servers map them to Unauthenticated (or,
// for ErrThrottled, ResourceExhausted) and count them by name.
var (
	ErrNoToken        = errors.New("no bearer token")
	ErrUnknownCluster = errors.New("unknown cluster")
	ErrRejected       = errors.New("token rejected by the token review")
	ErrNotWorkload    = errors.New("token is not a service account's")
	// ErrThrottled: the token is not cached and the TokenReview budget is
	// spent; the caller should retry later.
	ErrThrottled = errors.New("too many token reviews; retry later")
)

// Caller is an authenticated workload.
type Caller struct {
	Cluster        string
	Namespace      string
	ServiceAccount string
	// PodName and PodUID are set for a pod-bound token.
	PodName, PodUID string
}

// TokenReviewer asks one cluster's API server about a token; a typed
// clientset's AuthenticationV1().TokenReviews() fits through Reviewer.
type TokenReviewer interface {
	Review(ctx context.Context, token string, audiences []string) (authenticationv1.TokenReviewStatus, error)
}

// Config configures an Authenticator. Zero values take the defaults.
type Config struct {
	// LocalCluster is this cluster's ID; an empty clusterid header means it.
	LocalCluster string
	// Clusters maps cluster IDs (the local one included) to reviewers.
	Clusters map[string]TokenReviewer
	// Audiences the tokens must be for; default istio-ca.
	Audiences []string
	// CacheTTL is how long a positive answer is reused; default 30s.
	// DisableCache reviews every request (positive and negative).
	CacheTTL     time.Duration
	DisableCache bool
	// CacheSize bounds the positive cache; default 10,000 tokens.
	CacheSize int
	// NegativeTTL is how long a rejected token stays rejected without
	// another review; default 10s. NegativeCacheSize bounds that cache;
	// default 10,000 tokens.
	NegativeTTL       time.Duration
	NegativeCacheSize int
	// ReviewQPS and ReviewBurst budget the TokenReviews of each cluster
	// (defaults 25 a second, bursts of 50; a negative ReviewQPS removes the
	// budget). ReviewWait is the longest a review waits for the budget
	// before it is refused with ErrThrottled (default 1s; negative: never
	// wait).
	ReviewQPS   float64
	ReviewBurst int
	ReviewWait  time.Duration
	// ReviewTimeout bounds one TokenReview; default 10s.
	ReviewTimeout time.Duration
	Now           func() time.Time
}

// Defaults of Config.
const (
	DefaultCacheTTL      = 30 * time.Second
	DefaultCacheSize     = 10000
	DefaultNegativeTTL   = 10 * time.Second
	DefaultReviewQPS     = 25
	DefaultReviewBurst   = 50
	DefaultReviewWait    = time.Second
	DefaultReviewTimeout = 10 * time.Second
)

// Authenticator reviews tokens.
type Authenticator struct {
	cfg Config
	// limits holds one review budget per cluster; nil entries: no budget.
	limits map[string]*rate.Limiter
	flight singleflight.Group

	mu       sync.Mutex
	cache    map[[32]byte]cached
	rejected map[[32]byte]rejection
}

type cached struct {
	caller  Caller
	expires time.Time
}

type rejection struct {
	err     error
	expires time.Time
}

// New returns an Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Clusters[cfg.LocalCluster] == nil {
		return nil, fmt.Errorf("no token reviewer for the local cluster %q", cfg.LocalCluster)
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{"istio-ca"}
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = DefaultNegativeTTL
	}
	if cfg.NegativeCacheSize <= 0 {
		cfg.NegativeCacheSize = DefaultCacheSize
	}
	if cfg.ReviewQPS == 0 {
		cfg.ReviewQPS = DefaultReviewQPS
	}
	if cfg.ReviewBurst <= 0 {
		cfg.ReviewBurst = DefaultReviewBurst
	}
	if cfg.ReviewWait == 0 {
		cfg.ReviewWait = DefaultReviewWait
	}
	if cfg.ReviewWait < 0 {
		cfg.ReviewWait = 0
	}
	if cfg.ReviewTimeout <= 0 {
		cfg.ReviewTimeout = DefaultReviewTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Authenticator{cfg: cfg, limits: map[string]*rate.Limiter{}, cache: map[[32]byte]cached{}, rejected: map[[32]byte]rejection{}}
	for id := range cfg.Clusters {
		if cfg.ReviewQPS > 0 {
			a.limits[id] = rate.NewLimiter(rate.Limit(cfg.ReviewQPS), cfg.ReviewBurst)
		}
	}
	return a, nil
}

// Authenticate returns the caller a bearer token stands for, reviewed in
// the cluster clusterID names (empty: the local cluster).
func (a *Authenticator) Authenticate(ctx context.Context, token, clusterID string) (Caller, error) {
	if token == "" {
		return Caller{}, ErrNoToken
	}
	if clusterID == "" {
		clusterID = a.cfg.LocalCluster
	}
	reviewer := a.cfg.Clusters[clusterID]
	if reviewer == nil {
		return Caller{}, fmt.Errorf("%w %q", ErrUnknownCluster, clusterID)
	}
	key := sha256.Sum256([]byte(clusterID + "\x00" + token))
	if !a.cfg.DisableCache {
		if c, ok, err := a.lookup(key, a.cfg.Now()); ok {
			return c, err
		}
	}
	// Concurrent requests with one token (a proxy's xDS stream and its
	// certificate requests) share one review.
	v, err, _ := a.flight.Do(string(key[:]), func() (any, error) {
		return a.review(ctx, reviewer, clusterID, token, key)
	})
	if err != nil {
		return Caller{}, err
	}
	return v.(Caller), nil
}

// lookup answers from the caches.
func (a *Authenticator) lookup(key [32]byte, now time.Time) (Caller, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.cache[key]; ok && now.Before(c.expires) {
		return c.caller, true, nil
	}
	if r, ok := a.rejected[key]; ok && now.Before(r.expires) {
		return Caller{}, true, r.err
	}
	return Caller{}, false, nil
}

// review asks the cluster's API server, within its budget, and caches the
// answer: a caller, or a rejection of the token itself. Failures to ask
// (the budget, the API server) are not cached.
func (a *Authenticator) review(ctx context.Context, reviewer TokenReviewer, clusterID, token string, key [32]byte) (Caller, error) {
	// The review is shared: it must not end with the first caller's
	// stream.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReviewTimeout)
	defer cancel()
	if err := a.budget(rctx, clusterID); err != nil {
		return Caller{}, err
	}
	st, err := reviewer.Review(rctx, token, a.cfg.Audiences)
	if err != nil {
		return Caller{}, fmt.Errorf("token review in cluster %s: %w", clusterID, err)
	}
	caller, err := a.verdict(st, clusterID)
	if !a.cfg.DisableCache {
		a.store(key, caller, err, a.cfg.Now())
	}
	return caller, err
}

// budget waits for a review of cluster's budget, at most ReviewWait; when
// the budget cannot afford one in that time it returns ErrThrottled at once.
func (a *Authenticator) budget(ctx context.Context, clusterID string) error {
	lim := a.limits[clusterID]
	if lim == nil {
		return nil
	}
	err := ratewait.Take(ctx, lim, a.cfg.ReviewWait, a.cfg.Now)
	if errors.Is(err, ratewait.ErrTooLong) {
		return ErrThrottled
	}
	if err != nil {
		return fmt.Errorf("wait for the token review budget: %w", err)
	}
	return nil
}

// verdict turns a review's status into a caller or a rejection.
func (a *Authenticator) verdict(st authenticationv1.TokenReviewStatus, clusterID string) (Caller, error) {
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return Caller{}, fmt.Errorf("%w: %s", ErrRejected, msg)
	}
	if !audienceMatches(st.Audiences, a.cfg.Audiences) {
		return Caller{}, fmt.Errorf("%w: token audiences %v, want one of %v", ErrRejected, st.Audiences, a.cfg.Audiences)
	}
	return callerOf(st.User, clusterID)
}

func (a *Authenticator) store(key [32]byte, c Caller, err error, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		makeRoom(a.rejected, a.cfg.NegativeCacheSize, now, func(r rejection) time.Time { return r.expires })
		a.rejected[key] = rejection{err: err, expires: now.Add(a.cfg.NegativeTTL)}
		return
	}
	delete(a.rejected, key)
	makeRoom(a.cache, a.cfg.CacheSize, now, func(c cached) time.Time { return c.expires })
	a.cache[key] = cached{caller: c, expires: now.Add(a.cfg.CacheTTL)}
}

// makeRoom keeps a cache under its bound: when full, it drops what
// expired, and if nothing did, everything. A bound on memory matters more
// than the hit rate under a flood of tokens.
func makeRoom[V any](m map[[32]byte]V, size int, now time.Time, expires func(V) time.Time) {
	if len(m) < size {
		return
	}
	for k, v := range m {
		if !now.Before(expires(v)) {
			delete(m, k)
		}
	}
	if len(m) >= size {
		clear(m)
	}
}

// audienceMatches: an API server that does not echo audiences (older ones)
// has checked them already.
func audienceMatches(got, want []string) bool {
	if len(got) == 0 {
		return true
	}
	for _, g := range got {
		for _, w := range want {
			if g == w {
				return true
			}
		}
	}
	return false
}

const (
	saPrefix   = "system:serviceaccount:"
	extraPod   = "authentication.kubernetes.io/pod-name"
	extraPodID = "authentication.kubernetes.io/pod-uid"
)

func callerOf(u authenticationv1.UserInfo, cluster string) (Caller, error) {
	rest, ok := strings.CutPrefix(u.Username, saPrefix)
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return Caller{}, fmt.Errorf("%w: user %q", ErrNotWorkload, u.Username)
	}
	c := Caller{Cluster: cluster, Namespace: ns, ServiceAccount: sa}
	if v := u.Extra[extraPod]; len(v) == 1 {
		c.PodName = v[0]
	}
	if v := u.Extra[extraPodID]; len(v) == 1 {
		c.PodUID = v[0]
	}
	return c, nil
}
