package leader_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/canopy-mesh/canopy/controller/leader"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// Short durations, so that a lost lease is seen within seconds.
const (
	leaseDuration = 2 * time.Second
	renewDeadline = time.Second
	retryPeriod   = 200 * time.Millisecond
	settle        = 20 * time.Second
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newElector(t *testing.T, ns, id string, reg prometheus.Registerer) *leader.Elector {
	t.Helper()
	e, err := leader.New(leader.Config{Namespace: ns, Name: "canopy-controller", Identity: id,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod, Registerer: reg},
		env.Client.CoordinationV1(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run starts e.Run and returns a function that ends it and waits.
func run(t *testing.T, e *leader.Elector, lead func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, lead) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func holder(t *testing.T, ns string) string {
	t.Helper()
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "canopy-controller", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestOneLeaderAndHandOver runs two replicas: exactly one leads at a time;
// the leader, stopped, ends its writers before it releases the Lease, and
// the other takes over within a few retry periods, not a lease duration.
func TestOneLeaderAndHandOver(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "lease", nil)
	var (
		mu      sync.Mutex
		running = map[string]bool{}
		overlap bool
		// releasedEarly: a writer saw the Lease already given away while
		// it was still running.
		releasedEarly bool
	)
	regs := map[string]*prometheus.Registry{"a": prometheus.NewRegistry(), "b": prometheus.NewRegistry()}
	electors := map[string]*leader.Elector{}
	stops := map[string]func(){}
	for _, id := range []string{"a", "b"} {
		e := newElector(t, ns, id, regs[id])
		electors[id] = e
		stops[id] = run(t, e, func(ctx context.Context) error {
			mu.Lock()
			for other, on := range running {
				if on && other != id {
					overlap = true
				}
			}
			running[id] = true
			mu.Unlock()
			<-ctx.Done()
			if h := holder(t, ns); h != e.Identity() {
				mu.Lock()
				releasedEarly = true
				mu.Unlock()
			}
			mu.Lock()
			running[id] = false
			mu.Unlock()
			return nil
		})
	}
	leaderID := func() string {
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for id, on := range running {
			if on {
				ids = append(ids, id)
			}
		}
		if len(ids) != 1 {
			return ""
		}
		return ids[0]
	}
	eventually.Within(t, settle, "one replica leads", func() bool { return leaderID() != "" })
	first := leaderID()
	other := map[string]string{"a": "b", "b": "a"}[first]
	if h := holder(t, ns); h != electors[first].Identity() {
		t.Errorf("Lease holder %q, want %q", h, electors[first].Identity())
	}
	gauges := func() map[string]float64 {
		return map[string]float64{
			"a": gauge(t, regs["a"]),
			"b": gauge(t, regs["b"]),
		}
	}
	if diff := cmp.Diff(map[string]float64{first: 1, other: 0}, gauges()); diff != "" {
		t.Errorf("canopy_controller_leader (-want +got):\n%s", diff)
	}

	stopped := time.Now()
	stops[first]()
	eventually.Within(t, settle, "the other replica leads", func() bool { return leaderID() == other })
	took := time.Since(stopped)
	t.Logf("hand-over took %s", took)
	if took >= leaseDuration {
		t.Errorf("hand-over took %s, not under the lease duration %s: the Lease was not released", took, leaseDuration)
	}
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		t.Error("two replicas ran their writers at once")
	}
	if releasedEarly {
		t.Error("the Lease was released before the writers had stopped")
	}
	if diff := cmp.Diff(map[string]float64{first: 0, other: 1}, gauges()); diff != "" {
		t.Errorf("canopy_controller_leader after the hand-over (-want +got):\n%s", diff)
	}
}

// gauge reads the leader gauge of a registry holding only it.
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "canopy_controller_leader" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no canopy_controller_leader gauge")
	return 0
}

// TestLostLeaseStopsWritersAndCampaignsAgain takes the Lease away from a
// running leader: its writers stop, Run keeps going, and once the thief's
// lease runs out the replica leads again.
func TestLostLeaseStopsWritersAndCampaignsAgain(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "lease", nil)
	e := newElector(t, ns, "a", nil)
	var terms, ended atomic.Int32
	run(t, e, func(ctx context.Context) error {
		terms.Add(1)
		<-ctx.Done()
		ended.Add(1)
		return nil
	})
	eventually.Within(t, settle, "the replica leads", e.Leading)
	ctx := t.Context()
	leases := env.Client.CoordinationV1().Leases(ns)
	// The holder renews meanwhile: retried on conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, "canopy-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		thief, secs, now := "thief", int32(leaseDuration/time.Second), metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = &thief, &secs, &now, &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the writers stop", func() bool { return ended.Load() == 1 && !e.Leading() })
	eventually.Within(t, settle, "the replica leads again", func() bool { return terms.Load() == 2 && e.Leading() })
}

// TestFailingWritersGiveUpTheLease: writers that end on their own while
// leading give the Lease up; the replica campaigns again and runs them
// anew.
func TestFailingWritersGiveUpTheLease(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "lease", nil)
	e := newElector(t, ns, "a", nil)
	var terms atomic.Int32
	run(t, e, func(ctx context.Context) error {
		if terms.Add(1) == 1 {
			return errors.New("writer failed")
		}
		<-ctx.Done()
		return nil
	})
	eventually.Within(t, settle, "the writers run again", func() bool { return terms.Load() == 2 && e.Leading() })
	// Re-won by the same identity, the Lease counts a transition only if
	// it was released in between.
	l, err := env.Client.CoordinationV1().Leases(ns).Get(t.Context(), "canopy-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Spec.LeaseTransitions; got == nil || *got < 1 {
		t.Errorf("leaseTransitions %v, want at least 1: the Lease was not given up", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		name    string
		cfg     leader.Config
		wantErr bool
	}{
		{"defaults", leader.Config{LeaseDuration: leader.DefaultLeaseDuration, RenewDeadline: leader.DefaultRenewDeadline, RetryPeriod: leader.DefaultRetryPeriod}, false},
		{"lease not above renew", leader.Config{LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: time.Second}, true},
		{"renew not above jittered retry", leader.Config{LeaseDuration: 15 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 2 * time.Second}, true},
		{"zero", leader.Config{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.cfg.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}
