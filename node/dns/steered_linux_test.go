package dns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/internal/testing/bpfsteer"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// serveSteered is serve for a pod redirected by eBPF: nothing NATed, the
// DNS sockets found through the pod's socket map.
func serveSteered(t *testing.T, pair nettest.Pair, tbl *workloadtable.Table, up Upstreams) (*inpod.Pod, *Server) {
	t.Helper()
	root := nettest.BPFFS(t)
	self := []netip.Addr{pair.AddrA}
	if pair.AddrA6.IsValid() {
		self = append(self, pair.AddrA6)
	}
	bpfsteer.Steer(t, root, pair.A, self...)
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := inpod.OpenWith(ns, inpod.Options{DNS: true, BPFRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	if !pod.SocketMap {
		t.Fatal("the pod's socket map was not found")
	}
	if up == nil {
		up = func(*inpod.Pod) (Upstream, error) { return Upstream{}, fmt.Errorf("no resolvers in this test") }
	}
	s, err := New(Config{Table: tbl, Registerer: prometheus.NewRegistry(), Upstreams: up, Limits: Limits{ForwardTimeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	s.ServePod(pod, &workloadapi.Workload{Uid: "pod-1", Namespace: "demo", Name: "client", CanonicalName: "client"})
	return pod, s
}

// exchange asks q of server from inside the netns at ns, over network, as
// a resolver does: miekg/dns's client, like glibc's, connects its UDP
// socket to the server, and so takes answers from that address and port
// only.
func exchange(t *testing.T, ns, network string, server netip.AddrPort, q *mdns.Msg) (*mdns.Msg, error) {
	t.Helper()
	type res struct {
		r   *mdns.Msg
		err error
	}
	got := nettest.In(t, ns, func() (res, error) {
		c := &mdns.Client{Net: network, Timeout: 3 * time.Second}
		r, _, err := c.Exchange(q, server.String())
		return res{r, err}, nil
	})
	return got.r, got.err
}

// TestSteeredQueriesAnsweredFromTheServerAsked: a pod's query to any
// resolver, handed to the proxy's 15053 unNATed, is answered from that
// resolver's address and port 53, which its resolver's connected socket
// accepts: over UDP (the answer leaves from a socket bound there), over
// TCP (the accepted connection's own address), for both families.
func TestSteeredQueriesAnsweredFromTheServerAsked(t *testing.T) {
	nettest.NeedRoot(t)
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.254.1.0/24"), netip.MustParsePrefix("fd00:254:1::/64"))
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	serveSteered(t, pair, tbl, nil)
	want := []string{"echo.demo.svc.cluster.local. A 10.96.0.10"}

	for _, tc := range []struct {
		network string
		server  string
	}{
		{"udp", "10.254.96.10:53"},
		{"udp", "[fd00:254:96::10]:53"},
		{"tcp", "10.254.96.10:53"},
		{"tcp", "[fd00:254:96::10]:53"},
		// The peer's address: a resolver that exists makes no difference.
		{"udp", netip.AddrPortFrom(pair.AddrB, 53).String()},
	} {
		t.Run(tc.network+" to "+tc.server, func(t *testing.T) {
			r, err := exchange(t, pair.A, tc.network, netip.MustParseAddrPort(tc.server), query("echo.demo.svc.cluster.local.", mdns.TypeA))
			if err != nil {
				t.Fatal(err)
			}
			if got := answers(r); !slices.Equal(got, want) {
				t.Errorf("answers %q, want %q", got, want)
			}
		})
	}
}

// TestSteeredQueriesRelayed: a name outside the mesh is relayed to the
// pod's resolver (the proxy's marked query leaves the pod, not captured
// again) and its answer reaches the client from the server it asked.
func TestSteeredQueriesRelayed(t *testing.T) {
	nettest.NeedRoot(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.254.4.0/24"))
	resolver := netip.AddrPortFrom(pair.AddrB, 53)
	asked := resolverIn(t, pair.B, resolver.String(), func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetRcode(r, mdns.RcodeNameError)
		_ = w.WriteMsg(m)
	})
	up := podResolvers(t, served{pair: pair})
	serveSteered(t, pair, table(t), up)
	for _, network := range []string{"udp", "tcp"} {
		r, err := exchange(t, pair.A, network, resolver, query("nothing.example.org.", mdns.TypeA))
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if r.Rcode != mdns.RcodeNameError {
			t.Errorf("%s: %s, want the resolver's NXDOMAIN", network, mdns.RcodeToString[r.Rcode])
		}
	}
	if got := asked.Load(); got != 2 {
		t.Errorf("the resolver was asked %d times, want 2", got)
	}
}

// TestSteeredAnswersHoldFewSockets: a pod asking many servers gets every
// answer, and the proxy keeps at most maxReplySockets sockets for it;
// they close when the pod's DNS sockets do.
func TestSteeredAnswersHoldFewSockets(t *testing.T) {
	nettest.NeedRoot(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.254.2.0/24"))
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	pod, s := serveSteered(t, pair, tbl, nil)
	for i := range maxReplySockets + 4 {
		server := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 254, 97, byte(1 + i)}), 53)
		for range 2 {
			r, err := exchange(t, pair.A, "udp", server, query("echo.demo.svc.cluster.local.", mdns.TypeA))
			if err != nil || len(r.Answer) != 1 {
				t.Fatalf("query to %s: %v, %v", server, r, err)
			}
		}
	}
	s.mu.Lock()
	ps := s.pods["demo/client"]
	s.mu.Unlock()
	if ps == nil {
		t.Fatal("the pod is not served")
	}
	replies := ps.replies
	replies.mu.Lock()
	kept := len(replies.socks)
	replies.mu.Unlock()
	if kept != maxReplySockets {
		t.Errorf("%d answering sockets kept, want %d", kept, maxReplySockets)
	}
	if err := pod.Close(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "answering sockets closed with the pod's DNS sockets", func() bool {
		replies.mu.Lock()
		defer replies.mu.Unlock()
		return replies.closed && len(replies.socks) == 0
	})
}

// TestSteeredDNSSocketIsThePodsOwn: the socket for both families that
// takes a steered pod's queries is bound to the wildcard address, but to
// the loopback device: neither the pod's network nor the pod itself
// reaches it at the pod's address, as neither reached the DNS sockets of
// a pod redirected by netfilter.
func TestSteeredDNSSocketIsThePodsOwn(t *testing.T) {
	nettest.NeedRoot(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.254.3.0/24"))
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	serveSteered(t, pair, tbl, nil)
	for _, from := range []string{pair.B, pair.A} {
		_, err := exchange(t, from, "udp", netip.AddrPortFrom(pair.AddrA, inpod.DNSPort), query("echo.demo.svc.cluster.local.", mdns.TypeA))
		var ne net.Error
		if err == nil || !(errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("asking %s:%d from %s: %v, want no answer", pair.AddrA, inpod.DNSPort, from, err)
		}
	}
	// The loopback sockets answer as ever.
	for _, server := range []string{"127.0.0.1:15053", "[::1]:15053"} {
		if r, err := exchange(t, pair.A, "udp", netip.MustParseAddrPort(server), query("echo.demo.svc.cluster.local.", mdns.TypeA)); err != nil || len(r.Answer) != 1 {
			t.Errorf("the pod asking %s: %v, %v", server, r, err)
		}
	}
}

// TestSteeredAnswersFromTwoProxies: during an upgrade two proxies serve a
// steered pod and both answer queries to the same server, each from a
// socket bound to it (SO_REUSEADDR lets both bind it).
func TestSteeredAnswersFromTwoProxies(t *testing.T) {
	nettest.NeedRoot(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.254.5.0/24"))
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	root := nettest.BPFFS(t)
	bpfsteer.Steer(t, root, pair.A, pair.AddrA)
	var servers []*Server
	for range 2 {
		ns, err := os.Open(pair.A)
		if err != nil {
			t.Fatal(err)
		}
		pod, err := inpod.OpenWith(ns, inpod.Options{DNS: true, BPFRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pod.Close() })
		reg := prometheus.NewRegistry()
		s, err := New(Config{Table: tbl, Registerer: reg, Upstreams: func(*inpod.Pod) (Upstream, error) { return Upstream{}, errors.New("none") }})
		if err != nil {
			t.Fatal(err)
		}
		s.ServePod(pod, &workloadapi.Workload{Uid: "pod-1", Namespace: "demo", Name: "client"})
		servers = append(servers, s)
	}
	server := netip.MustParseAddrPort("10.254.96.10:53")
	for i := range 32 {
		// A new client socket, so a new source port, each time: the
		// kernel spreads them over both proxies' sockets.
		if r, err := exchange(t, pair.A, "udp", server, query("echo.demo.svc.cluster.local.", mdns.TypeA)); err != nil || len(r.Answer) != 1 {
			t.Fatalf("query %d: %v, %v", i, r, err)
		}
	}
	for i, s := range servers {
		s.mu.Lock()
		ps := s.pods["demo/client"]
		s.mu.Unlock()
		ps.replies.mu.Lock()
		n := len(ps.replies.socks)
		ps.replies.mu.Unlock()
		if n != 1 {
			t.Errorf("proxy %d answered from %d sockets, want 1 (each proxy answered some)", i, n)
		}
	}
}
