package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestFailedEnrollmentLeavesNothingInZDS: a pod the node proxy refuses
// fails its ADD, and nothing of it stays behind in ZDS: the server forgets
// it (no later snapshot hands it to a node proxy) and no handle on its
// network namespace stays open in the agent.
func TestFailedEnrollmentLeavesNothingInZDS(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("failed-node-%d", time.Now().UnixNano()%100000)
	p := nettest.NewPair(t, netip.MustParsePrefix("10.217.4.0/24"))
	ns := env.Namespace(t, "failed", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	proxy := &nodeProxy{refuse: "refused"}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	n := startNode(t, nodeName, zdsPath, p.B, t.TempDir())
	eventually.Within(t, settle, "node proxy connected", func() bool { return n.zds.Connected() == 1 })

	// The pod has no IP in its status yet, as during a real ADD, so only
	// the ADD tries to enroll it (the agent's passes wait for the IP).
	pod, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "refused"},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
		ContainerID: "c1", Netns: p.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID), IPs: []string{p.AddrA.String()},
	})
	if err == nil {
		t.Fatal("ADD of a pod the node proxy refused succeeded")
	}
	if !proxy.saw("refused " + string(pod.UID)) {
		t.Fatal("the node proxy was not asked")
	}
	if n.zds.Has(string(pod.UID)) {
		t.Error("the ZDS server still holds the refused pod: the next snapshot hands it to the node proxy")
	}
	if open := netnsHandles(t, p.A); open != 0 {
		t.Errorf("%d handles on the refused pod's network namespace are still open", open)
	}
	c := condition(getPod(t, ns, pod.Name))
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != agent.ReasonFailed {
		t.Errorf("Enrolled condition = %+v, want False with %s", c, agent.ReasonFailed)
	}
}

// netnsHandles counts this process's open file descriptors on the network
// namespace pinned at path.
func netnsHandles(t *testing.T, path string) int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		// Stat follows the descriptor to what it holds, whatever path
		// it was opened by.
		var fst syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc/self/fd", e.Name()), &fst) == nil && fst.Ino == st.Ino && fst.Dev == st.Dev {
			n++
		}
	}
	return n
}
