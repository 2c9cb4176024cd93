// Package authn authenticates callers of the CA and the xDS server by their
// Kubernetes service-account token (docs/wire-contract.md §6.3): a
// TokenReview with the CA's audiences, in the cluster the caller names in its
// clusterid header, caching positive answers briefly. It knows nothing of
// gRPC; the servers pass it the bearer token and the header.
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

	authenticationv1 "k8s.io/api/authentication/v1"
)

// Reasons authentication fails; servers map them to Unauthenticated and
// count them by name.
var (
	ErrNoToken        = errors.New("no bearer token")
	ErrUnknownCluster = errors.New("unknown cluster")
	ErrRejected       = errors.New("token rejected by the token review")
	ErrNotWorkload    = errors.New("token is not a service account's")
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

// Config configures an Authenticator.
type Config struct {
	// LocalCluster is this cluster's ID; an empty clusterid header means it.
	LocalCluster string
	// Clusters maps cluster IDs (the local one included) to reviewers.
	Clusters map[string]TokenReviewer
	// Audiences the tokens must be for; default istio-ca.
	Audiences []string
	// CacheTTL is how long a positive answer is reused; default 30s.
	// DisableCache reviews every request.
	CacheTTL     time.Duration
	DisableCache bool
	// CacheSize bounds the cache; default 10,000 tokens.
	CacheSize int
	Now       func() time.Time
}

// Authenticator reviews tokens.
type Authenticator struct {
	cfg Config

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	caller  Caller
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
		cfg.CacheTTL = 30 * time.Second
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = 10000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Authenticator{cfg: cfg, cache: map[[32]byte]cached{}}, nil
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
	now := a.cfg.Now()
	if !a.cfg.DisableCache {
		a.mu.Lock()
		c, ok := a.cache[key]
		a.mu.Unlock()
		if ok && now.Before(c.expires) {
			return c.caller, nil
		}
	}
	st, err := reviewer.Review(ctx, token, a.cfg.Audiences)
	if err != nil {
		return Caller{}, fmt.Errorf("token review in cluster %s: %w", clusterID, err)
	}
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
	caller, err := callerOf(st.User, clusterID)
	if err != nil {
		return Caller{}, err
	}
	if !a.cfg.DisableCache {
		a.store(key, caller, now)
	}
	return caller, nil
}

func (a *Authenticator) store(key [32]byte, c Caller, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= a.cfg.CacheSize {
		// Drop what expired; if nothing did, start over: a bound on
		// memory matters more than the hit rate under a flood of tokens.
		for k, v := range a.cache {
			if !now.Before(v.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= a.cfg.CacheSize {
			clear(a.cache)
		}
	}
	a.cache[key] = cached{caller: c, expires: now.Add(a.cfg.CacheTTL)}
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
