package dns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/configdump"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// served is a pod (A of a pair, with the agent's capture rules) whose DNS
// the server answers; B is where its resolver would be.
type served struct {
	pair     nettest.Pair
	resolver string // B:53, which the pod's queries are sent to
	reg      *prometheus.Registry
	pod      *inpod.Pod
	server   *Server
}

func serve(t *testing.T, subnet string, tbl *workloadtable.Table, lim Limits, up Upstreams) served {
	t.Helper()
	pair := nettest.NewPair(t, netip.MustParsePrefix(subnet))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := inpod.OpenWith(ns, inpod.Options{DNS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	reg := prometheus.NewRegistry()
	if up == nil {
		up = func(*inpod.Pod) (Upstream, error) { return Upstream{}, fmt.Errorf("no resolvers in this test") }
	}
	s, err := New(Config{Table: tbl, Upstreams: up, Limits: lim, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	s.ServePod(pod, &workloadapi.Workload{Uid: "pod-1", Namespace: "demo", Name: "client", CanonicalName: "client"})
	return served{pair: pair, resolver: pair.AddrB.String() + ":53", reg: reg, pod: pod, server: s}
}

// ask sends q from inside the pod to its resolver, as its libc would.
func (s served) ask(t *testing.T, c *mdns.Client, q *mdns.Msg) *mdns.Msg {
	t.Helper()
	return nettest.In(t, s.pair.A, func() (*mdns.Msg, error) {
		r, _, err := c.Exchange(q, s.resolver)
		return r, err
	})
}

func query(name string, qtype uint16) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func table(t *testing.T, addrs ...*workloadapi.Address) *workloadtable.Table {
	t.Helper()
	tbl := workloadtable.New()
	var rs []*discoveryv3.Resource
	for _, a := range addrs {
		b, err := proto.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &discoveryv3.Resource{Name: workloadapi.ResourceName(a), Resource: &anypb.Any{TypeUrl: workloadapi.AddressTypeURL, Value: b}})
	}
	if rej := tbl.Apply(workloadapi.AddressTypeURL, rs, nil); rej != nil {
		t.Fatal(workloadtable.JoinRejections(rej))
	}
	return tbl
}

func service(ns, host string, ips ...string) *workloadapi.Address {
	s := &workloadapi.Service{Name: host, Namespace: ns, Hostname: host}
	for _, ip := range ips {
		s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: netip.MustParseAddr(ip).AsSlice()})
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

// endpoints are n workloads of a headless service.
func endpoints(ns, host string, n int) []*workloadapi.Address {
	var out []*workloadapi.Address
	for i := range n {
		out = append(out, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: fmt.Sprintf("db-%d", i), Namespace: ns, Name: fmt.Sprintf("db-%d", i),
			Addresses: [][]byte{netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}).AsSlice()},
			Services:  map[string]*workloadapi.PortList{ns + "/" + host: {}},
		}}})
	}
	return out
}

func answers(m *mdns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *mdns.A:
			out = append(out, rr.Hdr.Name+" A "+rr.A.String())
		case *mdns.AAAA:
			out = append(out, rr.Hdr.Name+" AAAA "+rr.AAAA.String())
		case *mdns.CNAME:
			out = append(out, rr.Hdr.Name+" CNAME "+rr.Target)
		}
	}
	slices.Sort(out)
	return out
}

// TestMeshNamesAnsweredInThePod: a pod's captured queries for mesh names
// are answered by the server in its namespace, authoritative, with a
// 30 s TTL, over UDP and TCP.
func TestMeshNamesAnsweredInThePod(t *testing.T) {
	tbl := table(t, append(endpoints("demo", "db.demo.svc.cluster.local", 3),
		service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"),
		service("demo", "db.demo.svc.cluster.local"),
		service("demo", "api.example.com", "240.240.0.1", "2001:2::1"),
	)...)
	s := serve(t, "10.222.0.0/24", tbl, Limits{}, nil)
	tests := []struct {
		name, q string
		qtype   uint16
		want    []string
	}{
		{"a Service", "echo.demo.svc.cluster.local.", mdns.TypeA, []string{"echo.demo.svc.cluster.local. A 10.96.0.10"}},
		{"a known name without IPv6", "echo.demo.svc.cluster.local.", mdns.TypeAAAA, nil},
		{"a ServiceEntry host", "api.example.com.", mdns.TypeAAAA, []string{"api.example.com. AAAA 2001:2::1"}},
		{"the first step of the ndots walk", "api.example.com.demo.svc.cluster.local.", mdns.TypeA, []string{
			"api.example.com. A 240.240.0.1", "api.example.com.demo.svc.cluster.local. CNAME api.example.com.",
		}},
		{"a headless Service", "db.demo.svc.cluster.local.", mdns.TypeA, []string{
			"db.demo.svc.cluster.local. A 10.244.0.1", "db.demo.svc.cluster.local. A 10.244.0.2", "db.demo.svc.cluster.local. A 10.244.0.3",
		}},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				r := s.ask(t, &mdns.Client{Net: network, Timeout: 5 * time.Second}, query(tt.q, tt.qtype))
				if r.Rcode != mdns.RcodeSuccess || !r.Authoritative || !r.RecursionAvailable {
					t.Errorf("rcode %s, AA %v, RA %v; want NOERROR, AA, RA", mdns.RcodeToString[r.Rcode], r.Authoritative, r.RecursionAvailable)
				}
				if got := answers(r); !slices.Equal(got, tt.want) {
					t.Errorf("answers %q, want %q", got, tt.want)
				}
				for _, rr := range r.Answer {
					if rr.Header().Ttl != TTL {
						t.Errorf("TTL %d, want %d", rr.Header().Ttl, TTL)
					}
				}
			})
		}
	}
	got := testutil.ToFloat64(s.metricRequests("a", "udp"))
	if got != 3 {
		t.Errorf("istio_dns_requests_total{a,udp} = %v, want 3", got)
	}
}

func (s served) metricRequests(qtype, proto string) prometheus.Collector {
	return counterFrom(s.reg, "istio_dns_requests_total", map[string]string{"request_query_type": qtype, "request_protocol": proto})
}

// TestLargeAnswersAreTruncatedForTheClient: an answer bigger than the
// client can take over UDP (512 bytes without EDNS, what it advertised
// with) comes truncated, TC set; over TCP it comes whole.
func TestLargeAnswersAreTruncatedForTheClient(t *testing.T) {
	tbl := table(t, append(endpoints("demo", "big.demo.svc.cluster.local", 200), service("demo", "big.demo.svc.cluster.local"))...)
	s := serve(t, "10.223.0.0/24", tbl, Limits{}, nil)
	const name = "big.demo.svc.cluster.local."

	plain := s.ask(t, &mdns.Client{Net: "udp", UDPSize: mdns.MaxMsgSize, Timeout: 5 * time.Second}, query(name, mdns.TypeA))
	plain.Compress = true // as it came: Len is the size on the wire
	if !plain.Truncated || plain.Len() > mdns.MinMsgSize {
		t.Errorf("without EDNS over UDP: TC %v, %d bytes; want TC and at most 512", plain.Truncated, plain.Len())
	}
	q := query(name, mdns.TypeA)
	q.SetEdns0(1232, false)
	edns := s.ask(t, &mdns.Client{Net: "udp", UDPSize: mdns.MaxMsgSize, Timeout: 5 * time.Second}, q)
	edns.Compress = true
	if !edns.Truncated || edns.Len() > 1232 || edns.IsEdns0() == nil || edns.IsEdns0().UDPSize() != 1232 {
		t.Errorf("with EDNS 1232 over UDP: TC %v, %d bytes, OPT %v; want TC, at most 1232, the OPT mirrored", edns.Truncated, edns.Len(), edns.IsEdns0())
	}
	whole := s.ask(t, &mdns.Client{Net: "tcp", Timeout: 5 * time.Second}, query(name, mdns.TypeA))
	if whole.Truncated || len(whole.Answer) != 200 {
		t.Errorf("over TCP: TC %v, %d records; want all 200", whole.Truncated, len(whole.Answer))
	}
}

// TestTCPConnectionsPerPodAreBounded: a pod opening connection after
// connection to its resolver holds at most MaxTCPConns of them; the
// others are closed at once, and the server's goroutines stay bounded.
func TestTCPConnectionsPerPodAreBounded(t *testing.T) {
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	const max = 4
	s := serve(t, "10.224.0.0/24", tbl, Limits{MaxTCPConns: max, TCPIdleTimeout: time.Minute}, nil)
	base := runtime.NumGoroutine()
	var held []net.Conn
	for range 50 {
		c := nettest.In(t, s.pair.A, func() (net.Conn, error) { return net.DialTimeout("tcp4", s.resolver, 3*time.Second) })
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	eventually.True(t, "connections past the limit closed", func() bool {
		return testutil.ToFloat64(counterFrom(s.reg, "canopy_node_dns_dropped_total", map[string]string{"reason": reasonTCPLimit})) == 50-max
	})
	// The held ones still answer.
	alive := 0
	for _, c := range held {
		dc := &mdns.Conn{Conn: c}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if err := dc.WriteMsg(query("echo.demo.svc.cluster.local.", mdns.TypeA)); err != nil {
			continue
		}
		if r, err := dc.ReadMsg(); err == nil && len(r.Answer) == 1 {
			alive++
		}
	}
	if alive != max {
		t.Errorf("%d connections answered, want %d", alive, max)
	}
	if n := runtime.NumGoroutine(); n > base+3*max+10 {
		t.Errorf("%d goroutines with %d connections held (%d before): not bounded by the limit", n, len(held), base)
	}
}

// resolverIn starts a DNS server in the namespace at ns on addr (UDP
// and TCP) answering with answer, and returns how many queries it took.
func resolverIn(t *testing.T, ns, addr string, answer func(w mdns.ResponseWriter, r *mdns.Msg)) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	h := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) { n.Add(1); answer(w, r) })
	pc := nettest.In(t, ns, func() (net.PacketConn, error) { return net.ListenPacket("udp4", addr) })
	l := nettest.In(t, ns, func() (net.Listener, error) { return net.Listen("tcp4", addr) })
	for _, srv := range []*mdns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return &n
}

// podResolvers are the pod's resolvers as the node proxy finds them: no
// process of the pod in sight here, so the stand-in file, naming B.
func podResolvers(t *testing.T, s served) Upstreams {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("nameserver "+s.pair.AddrB.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Resolvers{ProcRoot: t.TempDir(), Fallback: conf}.Upstreams()
}

// TestOtherNamesGoToThePodsResolvers: what is not the mesh's (another
// type for a mesh name, a name outside the mesh) is relayed to the pod's
// resolver from inside its namespace, and its answer comes back as it
// came; a resolver that does not answer is SERVFAIL.
func TestOtherNamesGoToThePodsResolvers(t *testing.T) {
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	var up Upstreams
	s := serve(t, "10.225.0.0/24", tbl, Limits{ForwardTimeout: time.Second}, func(p *inpod.Pod) (Upstream, error) { return up(p) })
	up = podResolvers(t, s)
	asked := resolverIn(t, s.pair.B, s.resolver, func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		switch r.Question[0].Qtype {
		case mdns.TypeSRV:
			m.Answer = append(m.Answer, &mdns.SRV{Hdr: mdns.RR_Header{Name: r.Question[0].Name, Rrtype: mdns.TypeSRV, Class: mdns.ClassINET, Ttl: 77}, Priority: 1, Weight: 2, Port: 8080, Target: "echo.demo.svc.cluster.local."})
		default:
			m.Rcode = mdns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	for _, network := range []string{"udp", "tcp"} {
		c := &mdns.Client{Net: network, Timeout: 5 * time.Second}
		srv := s.ask(t, c, query("_http._tcp.echo.demo.svc.cluster.local.", mdns.TypeSRV))
		if len(srv.Answer) != 1 || srv.Answer[0].Header().Ttl != 77 || srv.Authoritative {
			t.Errorf("%s: SRV for a mesh name = %v; want the resolver's answer as it came", network, srv.Answer)
		}
		nx := s.ask(t, c, query("nothing.example.org.", mdns.TypeA))
		if nx.Rcode != mdns.RcodeNameError {
			t.Errorf("%s: a name outside the mesh: %s, want the resolver's NXDOMAIN", network, mdns.RcodeToString[nx.Rcode])
		}
	}
	if asked.Load() != 4 {
		t.Errorf("the resolver was asked %d times, want 4", asked.Load())
	}
	if got := testutil.ToFloat64(counterFrom(s.reg, "istio_dns_upstream_requests_total", nil)); got != 4 {
		t.Errorf("istio_dns_upstream_requests_total = %v, want 4", got)
	}

	// The resolver goes away: SERVFAIL, counted.
	up = podResolvers(t, served{pair: nettest.Pair{AddrB: netip.MustParseAddr("10.225.0.99")}})
	s2 := serve(t, "10.226.0.0/24", tbl, Limits{ForwardTimeout: 500 * time.Millisecond}, up)
	r := s2.ask(t, &mdns.Client{Net: "udp", Timeout: 5 * time.Second}, query("nothing.example.org.", mdns.TypeA))
	if r.Rcode != mdns.RcodeServerFailure {
		t.Errorf("no resolver answering: %s, want SERVFAIL", mdns.RcodeToString[r.Rcode])
	}
	if got := testutil.ToFloat64(counterFrom(s2.reg, "istio_dns_upstream_failures_total", nil)); got != 1 {
		t.Errorf("istio_dns_upstream_failures_total = %v, want 1", got)
	}
}

// TestQueriesInFlightPerPodAreBounded: a pod flooding its resolver with
// queries that wait (a resolver that never answers) holds at most
// MaxInFlight of them; the UDP ones past it are dropped and counted, a
// TCP one past it is answered SERVFAIL at once, and mesh names are
// answered all the while.
func TestQueriesInFlightPerPodAreBounded(t *testing.T) {
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"))
	const max = 4
	var up Upstreams
	s := serve(t, "10.227.0.0/24", tbl, Limits{MaxInFlight: max, ForwardTimeout: 2 * time.Second}, func(p *inpod.Pod) (Upstream, error) { return up(p) })
	up = podResolvers(t, s)
	release := make(chan struct{})
	resolverIn(t, s.pair.B, s.resolver, func(w mdns.ResponseWriter, r *mdns.Msg) { <-release })
	defer close(release)
	base := runtime.NumGoroutine()

	c := nettest.In(t, s.pair.A, func() (net.Conn, error) { return net.Dial("udp4", s.resolver) })
	defer c.Close()
	for i := range 100 {
		q := query(fmt.Sprintf("n%d.example.org.", i), mdns.TypeA)
		b, _ := q.Pack()
		_, _ = c.Write(b)
	}
	eventually.True(t, "queries past the limit dropped", func() bool {
		return testutil.ToFloat64(counterFrom(s.reg, "canopy_node_dns_dropped_total", map[string]string{"reason": reasonInFlight})) >= 100-max
	})
	if n := runtime.NumGoroutine(); n > base+4*max+20 {
		t.Errorf("%d goroutines with %d queries waiting (%d before)", n, max, base)
	}
	r := s.ask(t, &mdns.Client{Net: "tcp", Timeout: 5 * time.Second}, query("more.example.org.", mdns.TypeA))
	if r.Rcode != mdns.RcodeServerFailure {
		t.Errorf("a TCP query past the limit: %s, want SERVFAIL", mdns.RcodeToString[r.Rcode])
	}
	if r := s.ask(t, &mdns.Client{Net: "udp", Timeout: 5 * time.Second}, query("echo.demo.svc.cluster.local.", mdns.TypeA)); len(r.Answer) != 1 {
		t.Errorf("a mesh name during the flood: %v", r)
	}
}

// TestView: a served pod's DNS view lists the mesh names it sees with
// what it is answered, and the resolvers its other queries went to.
func TestView(t *testing.T) {
	private := service("other", "private.other.svc.cluster.local", "10.96.0.30")
	private.GetService().Visibility = workloadapi.Service_NAMESPACE
	tbl := table(t, service("demo", "echo.demo.svc.cluster.local", "10.96.0.10"), service("demo", "api.example.com", "240.240.0.1", "2001:2::1"), private)
	var up Upstreams
	s := serve(t, "10.228.0.0/24", tbl, Limits{}, func(p *inpod.Pod) (Upstream, error) { return up(p) })
	up = podResolvers(t, s)
	srv := s.server
	if _, ok := srv.View("demo/nobody", tbl.Snapshot().Services); ok {
		t.Error("a view of a pod not served")
	}
	resolverIn(t, s.pair.B, s.resolver, func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		_ = w.WriteMsg(m.SetRcode(r, mdns.RcodeNameError))
	})
	s.ask(t, &mdns.Client{Net: "udp", Timeout: 5 * time.Second}, query("nothing.example.org.", mdns.TypeA))
	v, ok := srv.View("demo/client", tbl.Snapshot().Services)
	if !ok {
		t.Fatal("no view of the served pod")
	}
	want := configdump.DNSView{
		Pod: "demo/client", ClusterDomain: "cluster.local",
		Resolvers: []string{s.pair.AddrB.String() + ":53"}, ResolversFrom: v.ResolversFrom,
		Names: []configdump.DNSName{
			{Name: "api.example.com", Service: "demo/api.example.com", Addresses: []string{"240.240.0.1", "2001:2::1"}},
			{Name: "echo.demo.svc.cluster.local", Service: "demo/echo.demo.svc.cluster.local", Addresses: []string{"10.96.0.10"}},
		},
	}
	if diff := cmp.Diff(want, v); diff != "" {
		t.Errorf("view (-want +got):\n%s", diff)
	}
	if v.ResolversFrom == "" || v.ResolversFrom == "pod" {
		t.Errorf("resolvers from %q, want the stand-in file", v.ResolversFrom)
	}
}

// TestAnswerUnderWayOutlivesTheDrain: a draining proxy closes its DNS
// sockets while a forwarded query waits for the pod's resolver. The answer
// still reaches the client (the socket is detached, not closed, until
// inpod.DNSLinger), and queries after it are refused at once.
func TestAnswerUnderWayOutlivesTheDrain(t *testing.T) {
	tbl := table(t)
	var up Upstreams
	s := serve(t, "10.229.0.0/24", tbl, Limits{ForwardTimeout: 3 * time.Second}, func(p *inpod.Pod) (Upstream, error) { return up(p) })
	up = podResolvers(t, s)
	arrived := make(chan struct{}, 1)
	resolverIn(t, s.pair.B, s.resolver, func(w mdns.ResponseWriter, r *mdns.Msg) {
		arrived <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		m := new(mdns.Msg)
		m.SetReply(r)
		m.Rcode = mdns.RcodeNameError
		_ = w.WriteMsg(m)
	})
	done := make(chan *mdns.Msg, 1)
	go func() {
		done <- s.ask(t, &mdns.Client{Net: "udp", Timeout: 5 * time.Second}, query("slow.example.org.", mdns.TypeA))
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the query never reached the resolver")
	}
	if err := s.pod.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Rcode != mdns.RcodeNameError {
			t.Errorf("the answer under way: %s, want the resolver's NXDOMAIN", mdns.RcodeToString[r.Rcode])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the answer under way was lost")
	}
}
