package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/taint"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// fakeTaint records its removal.
type fakeTaint struct{ rec *record }

// Remove implements agent.StartupTaint.
func (f fakeTaint) Remove(context.Context) (bool, error) {
	f.rec.add("taint removed")
	return true, nil
}

// startWithTaint runs the lifecycle with taint as the node's startup taint.
func (l *lifecycle) startWithTaint(t *testing.T, taint agent.StartupTaint) {
	t.Helper()
	l.cfg.ReadyRetry = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- agent.RunLifecycle(ctx, l.cfg, agent.Components{
			Agent: l.agent, Plugin: l.plugin, Removal: l.removal, Proxy: &fakeProxy{rec: l.rec},
			Taint: taint, Metrics: prometheus.NewRegistry(),
		}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestLifecycleRemovesStartupTaint: the startup taint goes only once the
// agent has synced, its plugin is in the chain and a self-test passed, in
// that order; while any of them is missing the taint stays.
func TestLifecycleRemovesStartupTaint(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	l.agent.waitForSync = true
	l.plugin.setInChainErr(errors.New("no primary CNI configuration"))
	l.agent.setSelfTestErr(errors.New("nftables: operation not supported"))
	l.startWithTaint(t, fakeTaint{rec: l.rec})

	eventually.True(t, "agent runs", func() bool { return l.rec.has("agent runs") })
	l.agent.sync()
	// Not in the chain: the self-test is not even tried.
	l.plugin.setInChainErr(nil)
	eventually.True(t, "self-test tried and failed twice", func() bool {
		return countOf(l.rec.list(), "self-test failed") >= 2
	})
	if l.rec.has("taint removed") {
		t.Fatal("taint removed while the self-test fails")
	}
	l.agent.setSelfTestErr(nil)
	eventually.True(t, "taint removed", func() bool { return l.rec.has("taint removed") })
	got := l.rec.list()
	assertOrder(t, got, [2]string{"self-test passed", "taint removed"})
	if n := countOf(got, "taint removed"); n != 1 {
		t.Errorf("taint removed %d times, want once", n)
	}
}

func countOf(events []string, e string) int {
	n := 0
	for _, x := range events {
		if x == e {
			n++
		}
	}
	return n
}

// TestStartupTaintLeavesOnlyAfterSelfTest against a real API server: a
// node registered with the startup taint keeps it while the agent's
// self-test fails, and loses it, and only it, once the self-test passes.
func TestStartupTaintLeavesOnlyAfterSelfTest(t *testing.T) {
	testenv.Need(t, env)
	name := fmt.Sprintf("taint-node-%d", time.Now().UnixNano()%100000)
	other := corev1.Taint{Key: "dedicated", Value: "mesh", Effect: corev1.TaintEffectNoSchedule}
	if _, err := env.Client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: taint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}, other}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	tainted := func() (ours, others bool) {
		node, err := env.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(node.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taint.DefaultKey }),
			slices.ContainsFunc(node.Spec.Taints, func(x corev1.Taint) bool { return x.Key == other.Key })
	}

	l := newLifecycle(t)
	l.agent.setSelfTestErr(errors.New("nftables: operation not supported"))
	l.startWithTaint(t, taint.Remover{Kube: env.Client, Node: name, Key: taint.DefaultKey})
	eventually.True(t, "self-test failed three times", func() bool { return countOf(l.rec.list(), "self-test failed") >= 3 })
	if ours, _ := tainted(); !ours {
		t.Fatal("the startup taint went while the self-test fails")
	}
	l.agent.setSelfTestErr(nil)
	eventually.True(t, "startup taint removed", func() bool { ours, _ := tainted(); return !ours })
	if _, others := tainted(); !others {
		t.Error("the node's other taint went too")
	}
}

// TestSelfTest enrolls a throwaway namespace with the real nftables
// backend, in ambient mode and, with sidecar capture on, in sidecar mode
// too; a backend that cannot verify fails it.
func TestSelfTest(t *testing.T) {
	nettest.NeedRoot(t)
	for _, tt := range []struct {
		name    string
		backend redirect.Backend
		sidecar bool
		wantErr bool
	}{
		{name: "nftables", backend: redirect.Nftables{}},
		{name: "nftables with sidecar capture", backend: redirect.Nftables{}, sidecar: true},
		{name: "drifting backend", backend: driftingBackend{}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := agent.Config{NodeName: "n1", Registerer: prometheus.NewRegistry(), Enroll: enroll.Config{SidecarCapture: tt.sidecar}}
			a, err := agent.New(cfg, nil, tt.backend, nopHost{}, nopProxy{}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if err := a.SelfTest(); (err != nil) != tt.wantErr {
				t.Errorf("SelfTest() = %v, want error = %v", err, tt.wantErr)
			}
		})
	}
}

// driftingBackend installs nothing and finds nothing.
type driftingBackend struct{}

// Name implements redirect.Backend.
func (driftingBackend) Name() string { return "drifting" }

// Enroll implements redirect.Backend.
func (driftingBackend) Enroll(string, redirect.PodConfig) error { return nil }

// Unenroll implements redirect.Backend.
func (driftingBackend) Unenroll(string) error { return nil }

// Verify implements redirect.Backend.
func (driftingBackend) Verify(string, redirect.PodConfig) error {
	return &redirect.DriftError{Problems: []string{"missing table inet istio-ambient-nat"}}
}
