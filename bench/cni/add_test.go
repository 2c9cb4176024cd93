package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
)

// newcomers is how many pods the ADD benchmark enrolls and removes again,
// in turn, while the node's other pods are enrolled.
const newcomers = 20

// BenchmarkAddDuringReconcile is the latency of a CNI ADD as the agent
// serves it (rules, host probe set, ZDS Ack, status patch) on a node whose
// 200 other pods are enrolled: "idle" with no reconcile pass running,
// "reconciling" with passes back to back, each verifying every pod in its
// netns. An ADD should not wait for a pass. One round of 20 ADDs is
// enough:
//
//	go test ./bench/cni -run '^$' -bench AddDuringReconcile -benchtime 1x
func BenchmarkAddDuringReconcile(b *testing.B) {
	for _, tt := range []struct {
		name   string
		period time.Duration
		// quiet: each ADD waits, off the clock, for no pass to run (every
		// pod event also starts one).
		quiet bool
	}{{"idle", time.Hour, true}, {"reconciling", time.Millisecond, false}} {
		b.Run(tt.name, func(b *testing.B) {
			f := setup(b)
			a := f.agent(b, tt.period)
			before, repairs := a.verifications(b), a.counter(b, "canopy_cni_host_rules_repairs_total")
			var took []time.Duration
			for b.Loop() {
				for i := range newcomers {
					if tt.quiet {
						b.StopTimer()
						a.quiesce(b)
						b.StartTimer()
					}
					took = append(took, a.cmd(b, pluginevent.PathAdd, newcomer(i), f.newcomers[i], netip.AddrFrom4([4]byte{10, 220, 0, byte(i + 1)})))
				}
				b.StopTimer()
				for i := range newcomers {
					a.cmd(b, pluginevent.PathDel, newcomer(i), f.newcomers[i], netip.Addr{})
				}
				b.StartTimer()
			}
			report(b, took)
			b.ReportMetric(a.verifications(b)-before, "pod-verifications")
			b.ReportMetric(a.counter(b, "canopy_cni_host_rules_repairs_total")-repairs, "host-repairs")
		})
	}
}

func newcomer(i int) string { return fmt.Sprintf("new-%d", i) }

// benchAgent is an agent serving the fixture's pods from a fake API server.
type benchAgent struct {
	handler http.Handler
	reg     *prometheus.Registry
}

// verifications is how many pod verifications the agent's passes made.
func (a *benchAgent) verifications(b *testing.B) float64 {
	return a.counter(b, "canopy_cni_verifications_total")
}

// counter sums the agent's counter called name.
func (a *benchAgent) counter(b *testing.B, name string) float64 {
	mfs, err := a.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// quiesce waits until no pass has verified a pod for 100ms.
func (a *benchAgent) quiesce(b *testing.B) {
	last := a.verifications(b)
	for {
		time.Sleep(100 * time.Millisecond)
		now := a.verifications(b)
		if now == last {
			return
		}
		last = now
	}
}

// agent starts an agent whose node runs the fixture's pods, all enrolled
// through ADDs, and whose reconcile passes come every period.
func (f *fixture) agent(b *testing.B, period time.Duration) *benchAgent {
	b.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient}}}
	objs := []runtime.Object{ns}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: name, UID: types.UID("uid-" + name)},
			Spec:       corev1.PodSpec{NodeName: "bench-node", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	for i := range pods {
		objs = append(objs, pod(fmt.Sprintf("pod-%d", i)))
	}
	for i := range newcomers {
		objs = append(objs, pod(newcomer(i)))
	}
	kube := fake.NewClientset(objs...)
	reg := prometheus.NewRegistry()
	a, err := agent.New(agent.Config{NodeName: "bench-node", ReconcilePeriod: period, ProcRoot: b.TempDir(), Registerer: reg},
		kube, redirect.Nftables{}, f.host, f.server, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	ba := &benchAgent{handler: a.PluginHandler(), reg: reg}
	// Every pod enrolled by its ADD, then given its IP (as the kubelet
	// reports it once the sandbox runs), so that passes verify it.
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 219, byte(i >> 8), byte(i)}) }
	for i := range pods {
		ba.cmd(b, pluginevent.PathAdd, fmt.Sprintf("pod-%d", i), f.pods[i], ip(i))
	}
	for i := range pods {
		st, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": ip(i).String(), "podIPs": []map[string]string{{"ip": ip(i).String()}}}})
		if _, err := kube.CoreV1().Pods("mesh").Patch(ctx, fmt.Sprintf("pod-%d", i), types.MergePatchType, st, metav1.PatchOptions{}, "status"); err != nil {
			b.Fatal(err)
		}
	}
	return ba
}

// cmd sends one plugin command for pod name in netns path; a valid ip is
// put on the namespace's loopback first and sent as the pod's IP.
func (a *benchAgent) cmd(b *testing.B, path, name, netnsPath string, ip netip.Addr) time.Duration {
	req := pluginevent.Request{ContainerID: name, Netns: netnsPath, PodName: name, PodNamespace: "mesh", PodUID: "uid-" + name}
	if ip.IsValid() {
		addAddr(b, netnsPath, ip)
		req.IPs = []string{ip.String()}
	}
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	w := httptest.NewRecorder()
	start := time.Now()
	a.handler.ServeHTTP(w, r)
	took := time.Since(start)
	if w.Code != http.StatusOK {
		b.Fatalf("%s %s: %d %s", path, name, w.Code, w.Body.String())
	}
	return took
}

// addAddr puts ip on the loopback of the namespace at path, once.
func addAddr(b *testing.B, path string, ip netip.Addr) {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		b.Fatal(err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}}
	if err := h.AddrReplace(lo, addr); err != nil {
		b.Fatal(err)
	}
}
