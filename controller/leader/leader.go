package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults of Config, client-go's own recommendation: a leader that stops
// renewing without releasing (a crash, a partition) is replaced within
// 15 s; one that releases, within a retry period.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config configures an Elector.
type Config struct {
	// Namespace and Name of the Lease. Replicas that must not write at
	// once share them; two control-plane revisions must not (each has its
	// own writers: its webhook configurations, its own ConfigMaps).
	Namespace, Name string
	// Identity names this replica in the Lease, e.g. the pod's name. A
	// random suffix is added: two processes that share a name (a
	// restarted pod whose predecessor still runs, two processes on one
	// host) must still be told apart.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's; zero
	// takes the defaults above.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Registerer receives the leader gauge; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Elector campaigns for one Lease.
type Elector struct {
	cfg    Config
	client coordinationv1.LeasesGetter
	log    *slog.Logger
	id     string

	leading atomic.Bool
}

// New returns an Elector of cfg's Lease; client should be one of its own
// (a request timeout below the renew deadline, and no rate limiter shared
// with bulk writes, which would delay renewals).
func New(cfg Config, client coordinationv1.LeasesGetter, log *slog.Logger) (*Elector, error) {
	if cfg.Namespace == "" || cfg.Name == "" || cfg.Identity == "" {
		return nil, errors.New("leader election: namespace, name and identity are required")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("leader election identity: %w", err)
	}
	e := &Elector{cfg: cfg, client: client, id: cfg.Identity + "_" + hex.EncodeToString(suffix)}
	e.log = log.With("component", "leader-election", "lease", cfg.Namespace+"/"+cfg.Name, "identity", e.id)
	if cfg.Registerer != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "canopy_controller_leader",
			Help:        "1 while this replica holds the Lease and runs the API writers (root ConfigMaps, ServiceEntry VIPs, webhook caBundle, Events), else 0.",
			ConstLabels: prometheus.Labels{"lease": cfg.Name},
		}, func() float64 {
			if e.leading.Load() {
				return 1
			}
			return 0
		})
		if err := cfg.Registerer.Register(g); err != nil {
			return nil, fmt.Errorf("register leader gauge: %w", err)
		}
	}
	return e, nil
}

// Validate checks the durations as client-go will: the lease outlasts the
// renew deadline, which outlasts a jittered retry period.
func (c Config) Validate() error {
	if c.LeaseDuration <= 0 || c.RenewDeadline <= 0 || c.RetryPeriod <= 0 {
		return errors.New("leader election: lease duration, renew deadline and retry period must be positive")
	}
	if c.LeaseDuration <= c.RenewDeadline {
		return fmt.Errorf("leader election: lease duration %s must exceed the renew deadline %s", c.LeaseDuration, c.RenewDeadline)
	}
	if float64(c.RenewDeadline) <= leaderelection.JitterFactor*float64(c.RetryPeriod) {
		return fmt.Errorf("leader election: renew deadline %s must exceed %.1f retry periods (%s)", c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod)
	}
	return nil
}

// Identity is this replica's name in the Lease.
func (e *Elector) Identity() string { return e.id }

// Leading reports whether this replica holds the Lease and runs the
// writers now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Run campaigns until ctx ends, calling lead with a context that ends
// when the Lease is lost or ctx ends each time it wins. lead must return
// soon after its context ends. If lead returns while the Lease is still
// held (an error), the Lease is released and, after a retry period, won
// anew. Run returns nil once ctx has ended, lead has returned and the
// Lease is released.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	for ctx.Err() == nil {
		if err := e.term(ctx, lead); err != nil {
			return err
		}
	}
	return nil
}

// term campaigns once: until the Lease is won and then lost, or ctx ends.
func (e *Elector) term(ctx context.Context, lead func(ctx context.Context) error) error {
	// The elector's context is not ctx: on shutdown the writers stop
	// first, and only then is the Lease released.
	electCtx, stopElect := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElect()

	var (
		mu       sync.Mutex
		stopping bool
		leadDone chan struct{} // closed when lead returns; nil before it starts
		failed   bool          // lead returned with the Lease held
	)
	started := func(leaseCtx context.Context) {
		mu.Lock()
		if stopping {
			mu.Unlock()
			return
		}
		done := make(chan struct{})
		leadDone = done
		mu.Unlock()
		defer close(done)
		// The writers stop when the Lease is lost or ctx ends, whichever
		// is first.
		writeCtx, cancel := context.WithCancel(leaseCtx)
		defer cancel()
		defer context.AfterFunc(ctx, cancel)()
		e.leading.Store(true)
		e.log.Info("leading: API writers started")
		err := lead(writeCtx)
		e.leading.Store(false)
		switch {
		case writeCtx.Err() != nil:
			e.log.Info("stopped leading: API writers stopped", "lease_lost", leaseCtx.Err() != nil && ctx.Err() == nil)
		default:
			mu.Lock()
			failed = true
			mu.Unlock()
			e.log.Error("API writers ended while leading; releasing the lease", "err", err)
			stopElect()
		}
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
		Client:     e.client,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: e.cfg.LeaseDuration,
		RenewDeadline: e.cfg.RenewDeadline,
		RetryPeriod:   e.cfg.RetryPeriod,
		// A stopping replica clears the holder, so another one takes over
		// at its next retry instead of when the lease runs out.
		ReleaseOnCancel: true,
		Name:            e.cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: started,
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				if identity != e.id {
					e.log.Info("another replica leads", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		le.Run(electCtx)
	}()
	waitLead := func() {
		mu.Lock()
		stopping = true
		done := leadDone
		mu.Unlock()
		if done != nil {
			<-done
		}
	}
	select {
	case <-ctx.Done():
		// Writers first (their context follows ctx), then the release.
		waitLead()
		stopElect()
		<-elected
		return nil
	case <-elected:
		// The Lease was lost, or given up after lead failed; its context
		// has ended.
		waitLead()
	}
	mu.Lock()
	retryLater := failed
	mu.Unlock()
	if retryLater {
		// Leave another replica the chance to take over, and do not spin
		// on a writer that fails at once.
		select {
		case <-ctx.Done():
		case <-time.After(e.cfg.RetryPeriod):
		}
	}
	return nil
}
