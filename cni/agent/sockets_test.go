package agent_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestEbpfSocketsReported: with the eBPF backend, a served pod whose node
// proxy has not put its sockets in the pod's socket map is counted (its
// traffic is dropped), and no longer once they are there; the pins of a
// pod gone while no agent ran are removed.
func TestEbpfSocketsReported(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	if err := bpfprog.Probe(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	root := nettest.BPFFS(t)
	// A gone pod's directory: no namespace has this inode.
	stale := filepath.Join(root, "4000000001")
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	nodeName := fmt.Sprintf("agent-node-%d", time.Now().UnixNano()%100000)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.218.8.0/24"))
	ns := env.Namespace(t, "mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	proxy := &nodeProxy{}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	pod := createPod(t, ns, "ebpf", nodeName, pair.AddrA, nil)
	podProcess(t, pair.A, pod.UID)
	n := startNodeWith(t, redirect.Ebpf{Root: root}, nodeName, zdsPath, pair.B, t.TempDir())

	eventually.Within(t, settle, "served pod with an empty socket map counted", func() bool {
		return proxy.saw("add "+string(pod.UID)) && counter(t, n.reg, "canopy_cni_unregistered_pods", "") == 1
	})
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the gone pod's pins are still there: %v", err)
	}

	// The node proxy's part: a socket in every slot.
	f, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := sockmap.Open(root, f)
	if err != nil || m == nil {
		t.Fatalf("the pod's socket map: %v, %v", m, err)
	}
	defer m.Close()
	err = netns.Do(pair.A, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false) // a socket map takes TCP sockets only
		for _, s := range []sockmap.Slot{sockmap.Outbound, sockmap.Inbound, sockmap.DNSTCP} {
			l, err := lc.Listen(context.Background(), "tcp", "[::]:0")
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			if err := sockmap.Register(m, s, l.(*net.TCPListener)); err != nil {
				return err
			}
		}
		pc, err := lc.ListenPacket(context.Background(), "udp", "[::]:0")
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		return sockmap.Register(m, sockmap.DNSUDP, pc.(*net.UDPConn))
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "pod no longer counted once the sockets are in", func() bool {
		return counter(t, n.reg, "canopy_cni_unregistered_pods", "") == 0
	})
}
