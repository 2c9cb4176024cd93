package proxy

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/canopy-mesh/canopy/internal/testing/bpfsteer"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestSteeredPod: a pod redirected by eBPF, where nothing is NATed, is
// served all the same: the app's connection to a server outside the mesh
// reaches it, its destination read from the accepted socket's local
// address. A connection the app makes to one of the proxy's own ports
// (which the redirection leaves alone: the pod's own address, loopback)
// has that port as its local address too, and is refused as a call to
// the proxy itself rather than carried back to the proxy in a loop.
func TestSteeredPod(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.254.0.0/24"))
	bpfsteer.Steer(t, root, pair.A, pair.AddrA)

	client := workload("c", "client", pair.AddrA)
	table := workloadtable.New()
	table.Apply(workloadapi.AddressTypeURL, []*discoveryv3.Resource{
		resource(t, workloadapi.AddressTypeURL, "c", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: client}}),
	}, nil)
	// Plain TCP outside the mesh needs no certificate.
	p, err := New(table, nil, "Kubernetes", prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := inpod.OpenWith(ns, inpod.Options{BPFRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	if !pod.SocketMap {
		t.Fatal("the pod's socket map was not found")
	}
	p.ServePod(pod, client)

	server := nettest.In(t, pair.B, func() (net.Listener, error) { return net.Listen("tcp4", ":9000") })
	t.Cleanup(func() { server.Close() })
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	m := &mesh{pair: pair}

	t.Run("outside the mesh through 15001", func(t *testing.T) {
		if got, err := m.send(t, pair.A, pair.AddrB.String()+":9000", "steered"); got != "steered" {
			t.Errorf("echo = %q, %v", got, err)
		}
	})
	refused := p.metrics.refused.WithLabelValues(reasonSelfCall)
	for _, to := range []string{
		pair.AddrA.String() + ":15001",
		pair.AddrA.String() + ":15006",
		"127.0.0.1:15001",
	} {
		t.Run("the app to "+to+" is refused", func(t *testing.T) {
			before := testutil.ToFloat64(refused)
			if got, _ := m.send(t, pair.A, to, "loop"); got != "" {
				t.Errorf("the proxy answered %q", got)
			}
			if got := testutil.ToFloat64(refused) - before; got != 1 {
				t.Errorf("canopy_node_connections_refused_total{reason=%q} grew by %v, want 1", reasonSelfCall, got)
			}
		})
	}
}
