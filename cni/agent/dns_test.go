package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// What dnsCapture reports of a pod's namespace.
const (
	withDNS    = "ambient rules with DNS capture"
	withoutDNS = "ambient rules without DNS capture"
)

// dnsCapture says which ambient rules the namespace at path holds, as the
// agent's backend verifies them: withDNS, withoutDNS, or the drift from
// the rules without DNS capture.
func dnsCapture(path string) string {
	cfg := redirect.DefaultPodConfig()
	if (redirect.Nftables{}).Verify(path, cfg) == nil {
		return withDNS
	}
	cfg.DNSCapture = false
	if err := (redirect.Nftables{}).Verify(path, cfg); err != nil {
		return err.Error()
	}
	return withoutDNS
}

// createPodAnnotated is createPod with annotations, set at creation so
// that no view of the pod lacks them.
func createPodAnnotated(t *testing.T, ns, name, node string, ip netip.Addr, annotations map[string]string) *corev1.Pod {
	t.Helper()
	return createRunning(t, ns, ip, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	})
}

// add runs the plugin's ADD of pod, whose namespace is at path.
func add(t *testing.T, n *node, pod *corev1.Pod, path string, ip netip.Addr) error {
	t.Helper()
	resp, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
		ContainerID: "c-" + pod.Name, Netns: path, PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: string(pod.UID), IPs: []string{ip.String()},
	})
	if err == nil && !resp.Enrolled {
		err = fmt.Errorf("pod not enrolled: %s", resp.Reason)
	}
	return err
}

// startProxy runs a test node proxy on the ZDS socket at path until the
// func it returns is called or the test ends.
func startProxy(t *testing.T, p *nodeProxy, path string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx, path) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// TestDNSCaptureWaitsForTheAck: an ADD installs the pod's rules without
// DNS capture, sends the pod to the node proxy, and turns DNS capture on
// once the proxy acknowledged it (its listeners, 15053 included, are
// open), as the node's default and the pod's ambient.istio.io/dns-capture
// annotation ask. The test node proxy holds each Add's ack while the test
// reads the pod's rules. The agent once installed DNS capture before the
// node proxy had heard of the pod.
func TestDNSCaptureWaitsForTheAck(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	for i, tt := range []struct {
		name       string
		defaultDNS bool
		annotation string // ambient.istio.io/dns-capture; "" for none
		want       []string
	}{
		{name: "default on", defaultDNS: true, want: []string{withoutDNS, withDNS}},
		{name: "default on, annotation false", defaultDNS: true, annotation: "false", want: []string{withoutDNS, withoutDNS}},
		{name: "default off", defaultDNS: false, want: []string{withoutDNS, withoutDNS}},
		{name: "default off, annotation true", defaultDNS: false, annotation: "true", want: []string{withoutDNS, withDNS}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nodeName := fmt.Sprintf("dns-ack-%d-%d", i, time.Now().UnixNano()%100000)
			p := nettest.NewPair(t, netip.MustParsePrefix(fmt.Sprintf("10.217.%d.0/24", 20+i)))
			ns := env.Namespace(t, "dns-ack", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
			zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
			// The first Add is held until released; a test that ends
			// early releases it before its node proxy stops.
			held, release := make(chan string, 1), make(chan struct{})
			var holdOnce, releaseOnce sync.Once
			proxy := &nodeProxy{hold: func(uid string) { holdOnce.Do(func() { held <- uid; <-release }) }}
			startProxy(t, proxy, zdsPath)
			unhold := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(unhold)
			n := startNode(t, nodeName, zdsPath, p.B, t.TempDir(), func(c *agent.Config) { c.Enroll.DNSCapture = tt.defaultDNS })
			eventually.Within(t, settle, "node proxy connected", func() bool { return n.zds.Connected() == 1 })

			var annotations map[string]string
			if tt.annotation != "" {
				annotations = map[string]string{enroll.AnnotationDNSCapture: tt.annotation}
			}
			pod := createPodAnnotated(t, ns, "app", nodeName, p.AddrA, annotations)
			added := make(chan error, 1)
			go func() { added <- add(t, n, pod, p.A, p.AddrA) }()
			var got []string
			select {
			case uid := <-held:
				if uid != string(pod.UID) {
					t.Fatalf("node proxy held pod %s, want %s", uid, pod.UID)
				}
				got = append(got, dnsCapture(p.A)) // before the ack
				unhold()
			case err := <-added:
				t.Fatalf("ADD returned before the node proxy acknowledged the pod: %v", err)
			case <-time.After(settle):
				t.Fatal("the node proxy was never sent the pod")
			}
			if err := <-added; err != nil {
				t.Fatal(err)
			}
			got = append(got, dnsCapture(p.A)) // once ADD returned
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("pod's rules before the ack, then after the ADD (-want +got):\n%s", diff)
			}
			// Passes after the ack hold the rules where the ADD left them.
			passes := counter(t, n.reg, "canopy_cni_verifications_total", "verified")
			eventually.Within(t, settle, "two verification passes", func() bool {
				return counter(t, n.reg, "canopy_cni_verifications_total", "verified") >= passes+2
			})
			if got := dnsCapture(p.A); got != tt.want[1] {
				t.Errorf("after two passes the pod has %s, want %s", got, tt.want[1])
			}
			if got := counter(t, n.reg, "canopy_cni_verifications_total", "repaired"); got != 0 {
				t.Errorf("%v repairs, want none: a pass fought the enrollment's rules", got)
			}
		})
	}
}

// TestDNSCaptureWhileNoProxy: a pod enrolled while no node proxy is
// connected is pending and keeps its DNS going to its resolvers, pass
// after pass and through the plugin's CHECK, until a node proxy takes it
// from the ZDS snapshot; then its DNS is captured and it is enabled. A
// node proxy leaving afterwards takes nothing away: the pod stays enabled
// and captured, for the proxy's successor. The agent once captured a
// pending pod's DNS, sending it to a port nobody listened on.
func TestDNSCaptureWhileNoProxy(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("dns-noproxy-%d", time.Now().UnixNano()%100000)
	p := nettest.NewPair(t, netip.MustParsePrefix("10.217.24.0/24"))
	ns := env.Namespace(t, "dns-noproxy", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	n := startNode(t, nodeName, zdsPath, p.B, t.TempDir())

	pod := createPod(t, ns, "app", nodeName, p.AddrA, nil)
	if err := add(t, n, pod, p.A, p.AddrA); err != nil {
		t.Fatal(err)
	}
	if got := dnsCapture(p.A); got != withoutDNS {
		t.Fatalf("a pod no node proxy serves has %s, want %s", got, withoutDNS)
	}
	eventually.Within(t, settle, "pod annotated pending", func() bool {
		return getPod(t, ns, pod.Name).Annotations[enroll.AnnotationRedirection] == enroll.RedirectionPending
	})
	passes := counter(t, n.reg, "canopy_cni_verifications_total", "verified")
	eventually.Within(t, settle, "two verification passes", func() bool {
		return counter(t, n.reg, "canopy_cni_verifications_total", "verified") >= passes+2
	})
	if got := dnsCapture(p.A); got != withoutDNS {
		t.Errorf("after two passes a pending pod has %s, want %s", got, withoutDNS)
	}
	if _, err := n.plugin.Do(t.Context(), pluginevent.PathCheck, pluginevent.Request{
		ContainerID: "c-app", Netns: p.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID),
	}); err != nil {
		t.Errorf("CHECK of a pending pod: %v", err)
	}

	proxy := &nodeProxy{}
	stopProxy := startProxy(t, proxy, zdsPath)
	eventually.Within(t, settle, "node proxy took the pod", func() bool { return proxy.saw("add " + string(pod.UID)) })
	eventually.Within(t, settle, "DNS captured once the node proxy took the pod", func() bool { return dnsCapture(p.A) == withDNS })
	eventually.Within(t, settle, "pod annotated enabled", func() bool {
		p := getPod(t, ns, pod.Name)
		c := condition(p)
		return p.Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled && c != nil && c.Reason == agent.ReasonVerified
	})

	stopProxy()
	eventually.Within(t, settle, "node proxy gone", func() bool { return n.zds.Connected() == 0 })
	passes = counter(t, n.reg, "canopy_cni_verifications_total", "verified")
	eventually.Within(t, settle, "two verification passes", func() bool {
		return counter(t, n.reg, "canopy_cni_verifications_total", "verified") >= passes+2
	})
	if got := dnsCapture(p.A); got != withDNS {
		t.Errorf("with its node proxy gone the pod has %s, want %s (no flapping)", got, withDNS)
	}
	if got := getPod(t, ns, pod.Name).Annotations[enroll.AnnotationRedirection]; got != enroll.RedirectionEnabled {
		t.Errorf("with its node proxy gone the pod is annotated %q, want %q", got, enroll.RedirectionEnabled)
	}
}

// TestAgentRestartKeepsDNSCapture: an agent restart leaves the DNS
// capture of a pod a node proxy serves in place, with no moment without
// it (its rules are read every few milliseconds and never rewritten), and
// does not capture the DNS of a pending pod until a node proxy takes it
// from the restarted agent's snapshot. The agent once captured the
// pending pod's DNS from its ADD on.
func TestAgentRestartKeepsDNSCapture(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("dns-restart-%d", time.Now().UnixNano()%100000)
	servedNS := nettest.NewPair(t, netip.MustParsePrefix("10.217.25.0/24"))
	pendingNS := nettest.NewPair(t, netip.MustParsePrefix("10.217.26.0/24"))
	ns := env.Namespace(t, "dns-restart", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	stateDir := t.TempDir()
	first := &nodeProxy{}
	stopFirst := startProxy(t, first, zdsPath)
	n := startNode(t, nodeName, zdsPath, servedNS.B, stateDir)
	eventually.Within(t, settle, "node proxy connected", func() bool { return n.zds.Connected() == 1 })

	served := createPod(t, ns, "served", nodeName, servedNS.AddrA, nil)
	if err := add(t, n, served, servedNS.A, servedNS.AddrA); err != nil {
		t.Fatal(err)
	}
	if got := dnsCapture(servedNS.A); got != withDNS {
		t.Fatalf("a served pod has %s, want %s", got, withDNS)
	}
	eventually.Within(t, settle, "served pod annotated enabled", func() bool {
		return getPod(t, ns, served.Name).Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled
	})
	// The node proxy goes, and a pod enrolled meanwhile is pending.
	stopFirst()
	eventually.Within(t, settle, "node proxy gone", func() bool { return n.zds.Connected() == 0 })
	pending := createPod(t, ns, "pending", nodeName, pendingNS.AddrA, nil)
	if err := add(t, n, pending, pendingNS.A, pendingNS.AddrA); err != nil {
		t.Fatal(err)
	}
	if got := dnsCapture(pendingNS.A); got != withoutDNS {
		t.Fatalf("a pending pod has %s, want %s", got, withoutDNS)
	}
	eventually.Within(t, settle, "pending pod annotated pending", func() bool {
		return getPod(t, ns, pending.Name).Annotations[enroll.AnnotationRedirection] == enroll.RedirectionPending
	})

	// The served pod's rules, read every few milliseconds from before the
	// restart until the new agent's snapshot went to a node proxy.
	ctx, cancel := context.WithCancel(t.Context())
	lost := make(chan string, 1)
	go func() {
		start := time.Now()
		for ctx.Err() == nil {
			if got := dnsCapture(servedNS.A); got != withDNS {
				lost <- fmt.Sprintf("%s at %v", got, time.Since(start).Round(time.Millisecond))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		lost <- ""
	}()
	before := tableHandle(t, servedNS.A)

	n.stop()
	n2 := startNode(t, nodeName, zdsPath, servedNS.B, stateDir)
	// The restarted agent has adopted both pods; no node proxy yet.
	if got := dnsCapture(pendingNS.A); got != withoutDNS {
		t.Errorf("after the restart, before a node proxy took it, the pending pod has %s, want %s", got, withoutDNS)
	}
	second := &nodeProxy{}
	startProxy(t, second, zdsPath)
	eventually.Within(t, settle, "a snapshot with both pods", func() bool {
		return second.saw("snapshot") && second.saw("add "+string(served.UID)) && second.saw("add "+string(pending.UID))
	})
	eventually.Within(t, settle, "the pending pod's DNS captured", func() bool { return dnsCapture(pendingNS.A) == withDNS })
	eventually.Within(t, settle, "the pending pod annotated enabled", func() bool {
		return getPod(t, ns, pending.Name).Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled
	})
	passes := counter(t, n2.reg, "canopy_cni_verifications_total", "verified")
	eventually.Within(t, settle, "two verification passes", func() bool {
		return counter(t, n2.reg, "canopy_cni_verifications_total", "verified") >= passes+2
	})
	cancel()
	if got := <-lost; got != "" {
		t.Errorf("during the agent restart the served pod's rules were, for a moment, %s", got)
	}
	if after := tableHandle(t, servedNS.A); after != before {
		t.Errorf("the restarted agent rewrote the served pod's rules: table %q became %q", before, after)
	}
}

// TestDNSCaptureAnnotation: a pod's ambient.istio.io/dns-capture
// annotation, changed while the pod runs, is applied on the next pass to
// the state the pod should have now: "false" keeps capture off whether a
// node proxy serves the pod or not, and taking "false" away from a
// pending pod still leaves its DNS uncaptured until a node proxy takes
// it. The agent once captured the DNS of a pending pod whose annotation
// no longer said "false".
func TestDNSCaptureAnnotation(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("dns-annotation-%d", time.Now().UnixNano()%100000)
	p := nettest.NewPair(t, netip.MustParsePrefix("10.217.27.0/24"))
	ns := env.Namespace(t, "dns-annotation", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	n := startNode(t, nodeName, zdsPath, p.B, t.TempDir())
	pod := createPodAnnotated(t, ns, "app", nodeName, p.AddrA, map[string]string{enroll.AnnotationDNSCapture: "false"})
	if err := add(t, n, pod, p.A, p.AddrA); err != nil {
		t.Fatal(err)
	}
	// annotate sets the annotation ("" removes it) and returns once a
	// pass has applied it: settings that change are rewritten, and
	// counted as a repair.
	annotate := func(t *testing.T, value string) {
		t.Helper()
		v := any(value)
		if value == "" {
			v = nil
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{enroll.AnnotationDNSCapture: v}}})
		repairs := counter(t, n.reg, "canopy_cni_verifications_total", "repaired")
		if _, err := env.Client.CoreV1().Pods(ns).Patch(t.Context(), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, settle, "a pass applied the annotation", func() bool {
			return counter(t, n.reg, "canopy_cni_verifications_total", "repaired") > repairs
		})
	}
	var got []string
	got = append(got, dnsCapture(p.A)) // pending, "false"
	annotate(t, "")
	got = append(got, dnsCapture(p.A)) // pending, no annotation
	annotate(t, "false")
	proxy := &nodeProxy{}
	startProxy(t, proxy, zdsPath)
	eventually.Within(t, settle, "node proxy took the pod", func() bool { return proxy.saw("add " + string(pod.UID)) })
	eventually.Within(t, settle, "pod annotated enabled", func() bool {
		return getPod(t, ns, pod.Name).Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled
	})
	got = append(got, dnsCapture(p.A)) // served, "false"
	annotate(t, "")
	got = append(got, dnsCapture(p.A)) // served, no annotation
	annotate(t, "false")
	got = append(got, dnsCapture(p.A)) // served, "false"
	want := []string{withoutDNS, withoutDNS, withoutDNS, withDNS, withoutDNS}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pod's rules: pending with \"false\", pending without it, served with \"false\", served without it, served with \"false\" (-want +got):\n%s", diff)
	}
}
