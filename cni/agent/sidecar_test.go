package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// createSidecarPod creates a pod as the injector leaves it for a CNI
// plugin (istio-validation, istio-proxy as 1337, the status annotation),
// with more annotations and istio-proxy environment, running at ip.
func createSidecarPod(t *testing.T, ns, name, node string, ip netip.Addr, annotations map[string]string, proxyEnv ...corev1.EnvVar) *corev1.Pod {
	t.Helper()
	a := map[string]string{enroll.AnnotationSidecarStatus: `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`}
	for k, v := range annotations {
		a[k] = v
	}
	return createRunning(t, ns, ip, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: a},
		Spec: corev1.PodSpec{
			NodeName:       node,
			InitContainers: []corev1.Container{{Name: "istio-validation", Image: "istio/proxyv2"}},
			Containers: []corev1.Container{
				{Name: "app", Image: "canopy/echo"},
				{
					Name: enroll.ContainerProxy, Image: "istio/proxyv2", Args: []string{"proxy", "sidecar"}, Env: proxyEnv,
					SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1337), RunAsGroup: ptr.To[int64](1337)},
				},
			},
		},
	})
}

// modeCounter is a counter or gauge of the agent by its labels' values.
func modeCounter(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, v := range values {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetValue() == v
				}
				if !found {
					continue metric
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// captured reports whether a TCP connect from the netns at path to an
// address outside it lands on a listener on 15001 inside it.
func captured(t *testing.T, path string, to netip.AddrPort) bool {
	t.Helper()
	l := nettest.In(t, path, func() (net.Listener, error) { return net.Listen("tcp4", "0.0.0.0:15001") })
	defer l.Close()
	accepted := make(chan bool, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err == nil
	}()
	var c net.Conn
	err := netns.Do(path, func() (err error) {
		c, err = net.DialTimeout("tcp4", to.String(), time.Second)
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	select {
	case ok := <-accepted:
		return ok
	case <-time.After(time.Second):
		return false
	}
}

func sidecarRules(t *testing.T, pod *corev1.Pod) redirect.PodConfig {
	t.Helper()
	c, err := enroll.SidecarCapture(pod)
	if err != nil {
		t.Fatal(err)
	}
	return redirect.PodConfig{Sidecar: c}
}

// TestAgentCapturesSidecarPods drives the agent's sidecar path through a
// real API server and real namespaces: the capture installed within the
// ADD, kept and repaired, following the pod's annotations, refused for
// malformed ones, never for proxyless pods, and gone on DEL; the node
// proxy never hears of these pods.
func TestAgentCapturesSidecarPods(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("sidecar-node-%d", time.Now().UnixNano()%100000)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.218.0.0/24"))
	bad := nettest.NewPair(t, netip.MustParsePrefix("10.218.1.0/24"))
	grpc := nettest.NewPair(t, netip.MustParsePrefix("10.218.2.0/24"))
	ns := env.Namespace(t, "sidecars", map[string]string{enroll.LabelInjection: "enabled"})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	proxy := &nodeProxy{}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	n := startNode(t, nodeName, zdsPath, pair.B, t.TempDir(), func(c *agent.Config) { c.Enroll.SidecarCapture = true })
	outside := netip.AddrPortFrom(pair.AddrB, 9000)

	pod := createSidecarPod(t, ns, "web", nodeName, pair.AddrA, map[string]string{enroll.AnnotationExcludeOutboundPorts: "9100"})
	t.Run("ADD installs the capture before it returns", func(t *testing.T) {
		resp, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
			ContainerID: "c1", Netns: pair.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID), IPs: []string{pair.AddrA.String()},
		})
		if err != nil || !resp.Enrolled || resp.Reason != enroll.ReasonSidecar {
			t.Fatalf("ADD = %+v, %v", resp, err)
		}
		if err := (redirect.Nftables{}).Verify(pair.A, sidecarRules(t, pod)); err != nil {
			t.Fatalf("capture not in place when ADD returned: %v", err)
		}
		if !captured(t, pair.A, outside) {
			t.Error("outbound TCP of the pod is not captured")
		}
		if captured(t, pair.A, netip.AddrPortFrom(pair.AddrB, 9100)) {
			t.Error("an excluded outbound port is captured")
		}
		// A reconcile pass may have found the pod's recorded namespace
		// first and enrolled it too.
		if got := modeCounter(t, n.reg, "canopy_cni_enrollments_total", "enabled", "sidecar"); got < 1 {
			t.Errorf("canopy_cni_enrollments_total{outcome=enabled,mode=sidecar} = %v, want at least 1", got)
		}
		if got := modeCounter(t, n.reg, "canopy_cni_enrolled_pods", "sidecar"); got != 1 {
			t.Errorf("canopy_cni_enrolled_pods{mode=sidecar} = %v, want 1", got)
		}
	})

	t.Run("the pod says so, without the ambient annotation, and the node proxy never hears of it", func(t *testing.T) {
		eventually.Within(t, settle, "condition True", func() bool {
			c := condition(getPod(t, ns, pod.Name))
			return c != nil && c.Status == corev1.ConditionTrue
		})
		// A few passes of the reconcile loop.
		time.Sleep(time.Second)
		if v, ok := getPod(t, ns, pod.Name).Annotations[enroll.AnnotationRedirection]; ok {
			t.Errorf("sidecar pod annotated %s=%s", enroll.AnnotationRedirection, v)
		}
		if proxy.saw("add " + string(pod.UID)) {
			t.Error("the node proxy got the sidecar pod")
		}
	})

	t.Run("rules deleted behind the agent's back are repaired", func(t *testing.T) {
		nettest.In(t, pair.A, func() ([]byte, error) {
			return exec.Command("nft", "delete", "table", "inet", redirect.SidecarNatTable).CombinedOutput()
		})
		eventually.Within(t, settle, "capture repaired and counted", func() bool {
			return (redirect.Nftables{}).Verify(pair.A, sidecarRules(t, pod)) == nil &&
				modeCounter(t, n.reg, "canopy_cni_verifications_total", "repaired", "sidecar") >= 1
		})
	})

	t.Run("changed annotations take effect", func(t *testing.T) {
		patchAnnotations(t, ns, pod.Name, map[string]any{enroll.AnnotationExcludeOutboundPorts: "9100,9000"})
		want := sidecarRules(t, getPod(t, ns, pod.Name))
		eventually.Within(t, settle, "new capture in place", func() bool { return (redirect.Nftables{}).Verify(pair.A, want) == nil })
		if captured(t, pair.A, outside) {
			t.Error("a newly excluded port is still captured")
		}
	})

	t.Run("malformed annotations on a running pod keep its capture", func(t *testing.T) {
		before := sidecarRules(t, getPod(t, ns, pod.Name))
		patchAnnotations(t, ns, pod.Name, map[string]any{enroll.AnnotationIncludeInboundPorts: "http"})
		eventually.Within(t, settle, "condition says the settings are invalid", func() bool {
			c := condition(getPod(t, ns, pod.Name))
			return c != nil && c.Status == corev1.ConditionTrue && c.Reason == agent.ReasonInvalidSettings && strings.Contains(c.Message, "includeInboundPorts")
		})
		if err := (redirect.Nftables{}).Verify(pair.A, before); err != nil {
			t.Errorf("capture changed: %v", err)
		}
	})

	t.Run("a pod with malformed annotations does not start", func(t *testing.T) {
		p := createSidecarPod(t, ns, "bad", nodeName, bad.AddrA, map[string]string{enroll.AnnotationExcludeOutboundRanges: "10.0.0.0/33"})
		_, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
			ContainerID: "c2", Netns: bad.A, PodName: p.Name, PodNamespace: ns, PodUID: string(p.UID), IPs: []string{bad.AddrA.String()},
		})
		if err == nil || !strings.Contains(err.Error(), enroll.AnnotationExcludeOutboundRanges) {
			t.Fatalf("ADD = %v, want an error naming %s", err, enroll.AnnotationExcludeOutboundRanges)
		}
		if rs := nettest.In(t, bad.A, func() ([]byte, error) { return exec.Command("nft", "list", "ruleset").CombinedOutput() }); strings.Contains(string(rs), "istio") {
			t.Errorf("a refused pod has rules:\n%s", rs)
		}
		eventually.Within(t, settle, "condition False", func() bool {
			c := condition(getPod(t, ns, p.Name))
			return c != nil && c.Status == corev1.ConditionFalse
		})
	})

	t.Run("a proxyless pod is never captured", func(t *testing.T) {
		p := createSidecarPod(t, ns, "grpc", nodeName, grpc.AddrA, nil, corev1.EnvVar{Name: enroll.EnvDisableEnvoy, Value: "true"})
		resp, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
			ContainerID: "c3", Netns: grpc.A, PodName: p.Name, PodNamespace: ns, PodUID: string(p.UID), IPs: []string{grpc.AddrA.String()},
		})
		if err != nil || resp.Enrolled || !strings.Contains(resp.Reason, "proxyless") {
			t.Fatalf("ADD = %+v, %v; want not enrolled, as proxyless", resp, err)
		}
		time.Sleep(time.Second) // a few reconcile passes
		if captured(t, grpc.A, netip.AddrPortFrom(grpc.AddrB, 9000)) {
			t.Error("the proxyless pod's traffic is captured")
		}
	})

	t.Run("DEL removes the capture", func(t *testing.T) {
		if _, err := n.plugin.Do(t.Context(), pluginevent.PathDel, pluginevent.Request{
			ContainerID: "c1", Netns: pair.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID),
		}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if rs := nettest.In(t, pair.A, func() ([]byte, error) { return exec.Command("nft", "list", "ruleset").CombinedOutput() }); strings.Contains(string(rs), "istio") {
			t.Errorf("rules left after DEL:\n%s", rs)
		}
		if captured(t, pair.A, outside) {
			t.Error("traffic still captured after DEL")
		}
		eventually.Within(t, settle, "no sidecar pod counted", func() bool {
			return modeCounter(t, n.reg, "canopy_cni_enrolled_pods", "sidecar") == 0
		})
	})
}

func patchAnnotations(t *testing.T, ns, name string, annotations map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if _, err := env.Client.CoreV1().Pods(ns).Patch(t.Context(), name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
