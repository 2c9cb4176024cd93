package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestPodFoundByIdentityNotByIP: a pod with NET_ADMIN puts another pod's
// IP on its own loopback. Two namespaces hold that IP; when the agent
// looks for the victim's namespace (a pod it never saw the ADD of, or any
// pod after an agent restart) it must pick the victim's, never the
// impostor's: the node proxy would serve the impostor under the victim's
// identity. The impostors are pinned where the agent once looked first.
func TestPodFoundByIdentityNotByIP(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("identity-node-%d", time.Now().UnixNano()%100000)
	ns := env.Namespace(t, "identity", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	proxy := &nodeProxy{}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	stateDir := t.TempDir()

	// The victim runs before the agent starts; the impostor is another
	// pod (a process of its own, in its own pod's cgroup) holding the
	// victim's IP.
	running := nettest.NewPair(t, netip.MustParsePrefix("10.217.5.0/24"))
	victim := createPod(t, ns, "victim", nodeName, running.AddrA, nil)
	podProcess(t, running.A, victim.UID)
	impostor := impostorNetns(t, running.AddrA)
	podProcess(t, impostor, "5a5a5a5a-1111-2222-3333-444455556666")

	n := startNode(t, nodeName, zdsPath, running.B, stateDir)
	t.Run("a pod that started before the agent", func(t *testing.T) {
		eventually.Within(t, settle, "node proxy got the victim", func() bool { return proxy.netnsOf(victim.UID) != 0 })
		checkChosen(t, proxy, victim.UID, running.A, impostor)
	})

	// A pod enrolled by its ADD, then an impostor of it while the agent
	// restarts: the restarted agent finds the pod by what the ADD
	// recorded.
	added := nettest.NewPair(t, netip.MustParsePrefix("10.217.6.0/24"))
	pod := createPod(t, ns, "added", nodeName, added.AddrA, nil)
	if _, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
		ContainerID: "c1", Netns: added.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID), IPs: []string{added.AddrA.String()},
	}); err != nil {
		t.Fatal(err)
	}
	n.stop()
	impostor2 := impostorNetns(t, added.AddrA)
	proxy.reset()
	startNode(t, nodeName, zdsPath, running.B, stateDir)
	t.Run("pods after an agent restart", func(t *testing.T) {
		eventually.Within(t, settle, "a snapshot", func() bool { return proxy.saw("snapshot") })
		checkChosen(t, proxy, pod.UID, added.A, impostor2)
		checkChosen(t, proxy, victim.UID, running.A, impostor)
	})
}

// checkChosen checks that the node proxy got the pod with uid with the
// namespace at right, and that the rules are there and not in wrong.
func checkChosen(t *testing.T, proxy *nodeProxy, uid types.UID, right, wrong string) {
	t.Helper()
	if got, want := proxy.netnsOf(uid), inodeOf(t, right); got != want {
		t.Errorf("node proxy got namespace %d for pod %s, want %d (the impostor's is %d)", got, uid, want, inodeOf(t, wrong))
	}
	// DNS capture is added once the node proxy has acknowledged the pod,
	// a moment after the proxy saw it.
	err := (redirect.Nftables{}).Verify(right, redirect.DefaultPodConfig())
	for deadline := time.Now().Add(settle); err != nil && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		err = (redirect.Nftables{}).Verify(right, redirect.DefaultPodConfig())
	}
	if err != nil {
		t.Errorf("the pod's rules: %v", err)
	}
	if err := (redirect.Nftables{}).Verify(wrong, redirect.DefaultPodConfig()); err == nil {
		t.Error("the impostor's namespace got the pod's rules")
	}
}

// impostorNetns is a namespace holding ip on its loopback, pinned under a
// name that lists before the test pairs' (cnp-test-...).
func impostorNetns(t *testing.T, ip netip.Addr) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	path, err := netns.Create("cnp-a-impostor-" + hex.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(path) })
	if err := netns.Do(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	return path
}

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
