package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// stuckBackend is a redirection backend whose Verify of one namespace
// blocks until released: a reconcile pass stuck on one pod's I/O.
type stuckBackend struct {
	stuckOn string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// Name implements redirect.Backend.
func (*stuckBackend) Name() string { return "stuck" }

// Enroll implements redirect.Backend.
func (*stuckBackend) Enroll(string, redirect.PodConfig) error { return nil }

// Unenroll implements redirect.Backend.
func (*stuckBackend) Unenroll(string) error { return nil }

// Verify implements redirect.Backend.
func (b *stuckBackend) Verify(path string, _ redirect.PodConfig) error {
	if sameNetns(path, b.stuckOn) {
		b.once.Do(func() { close(b.entered) })
		<-b.release
	}
	return nil
}

func sameNetns(a, b string) bool {
	ia, ib := statIno(a), statIno(b)
	return ia != 0 && ia == ib
}

// nopHost is host probe rules that hold nothing.
type nopHost struct{}

func (nopHost) Sync([]netip.Addr) error               { return nil }
func (nopHost) Add(...netip.Addr) error               { return nil }
func (nopHost) Remove(...netip.Addr) error            { return nil }
func (nopHost) Verify([]netip.Addr) ([]string, error) { return nil, nil }
func (nopHost) Delete() error                         { return nil }

// nopProxy is a node proxy that takes every pod.
type nopProxy struct{}

func (nopProxy) Add(p zds.Pod) error {
	if p.Netns != nil {
		p.Netns.Close()
	}
	return nil
}
func (nopProxy) Delete(string) error { return nil }

// TestAddDoesNotWaitForAPass: while a reconcile pass is stuck in one pod's
// I/O, another pod's CNI ADD completes. The agent once held one lock
// across every pod's netlink, ZDS and API calls, so an ADD waited behind
// a whole pass.
func TestAddDoesNotWaitForAPass(t *testing.T) {
	nettest.NeedRoot(t)
	busy := nettest.NewPair(t, netip.MustParsePrefix("10.217.7.0/24"))
	newcomer, err := netns.Create("cnp-newcomer-" + randomID())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(newcomer) })

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient}}}
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: name, UID: types.UID(uid)},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	kube := fake.NewClientset(ns, pod("busy", "0b6b1ad2-54c8-4b1e-9d3c-000000000001"), pod("newcomer", "0b6b1ad2-54c8-4b1e-9d3c-000000000002"))
	backend := &stuckBackend{stuckOn: busy.A, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(backend.release) }) }
	t.Cleanup(release)
	a, err := agent.New(agent.Config{NodeName: "n1", ReconcilePeriod: time.Hour, ProcRoot: t.TempDir()},
		kube, backend, nopHost{}, nopProxy{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { release(); cancel(); <-done })
	handler := a.PluginHandler()

	add := func(name, uid, netnsPath string, ip netip.Addr) error {
		body, _ := json.Marshal(pluginevent.Request{ContainerID: name, Netns: netnsPath, PodName: name, PodNamespace: "mesh", PodUID: uid, IPs: []string{ip.String()}})
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, httptest.NewRequest(http.MethodPost, pluginevent.PathAdd, bytes.NewReader(body)))
		if w.Code != http.StatusOK {
			return &addError{w.Body.String()}
		}
		return nil
	}
	if err := add("busy", "0b6b1ad2-54c8-4b1e-9d3c-000000000001", busy.A, busy.AddrA); err != nil {
		t.Fatal(err)
	}
	// The busy pod gets its IP: the pass this starts verifies it, and
	// gets stuck there.
	st, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": busy.AddrA.String(), "podIPs": []map[string]string{{"ip": busy.AddrA.String()}}}})
	if _, err := kube.CoreV1().Pods("mesh").Patch(t.Context(), "busy", types.MergePatchType, st, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-backend.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no reconcile pass reached the busy pod")
	}

	added := make(chan error, 1)
	go func() {
		added <- add("newcomer", "0b6b1ad2-54c8-4b1e-9d3c-000000000002", newcomer, netip.MustParseAddr("10.217.8.2"))
	}()
	select {
	case err := <-added:
		if err != nil {
			t.Errorf("ADD during the pass: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("an ADD waited for a reconcile pass stuck on another pod")
	}
	release()
}

type addError struct{ msg string }

func (e *addError) Error() string { return "ADD failed: " + e.msg }

func statIno(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func randomID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
