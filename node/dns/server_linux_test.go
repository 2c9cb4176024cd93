package dns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
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
		up = func(*inpod.Pod) (Forwarder, bool, error) { return nil, false, fmt.Errorf("no resolvers in this test") }
	}
	s, err := New(Config{Table: tbl, Upstreams: up, Limits: lim, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	s.ServePod(pod, &workloadapi.Workload{Uid: "pod-1", Namespace: "demo", Name: "client", CanonicalName: "client"})
	return served{pair: pair, resolver: pair.AddrB.String() + ":53", reg: reg, pod: pod}
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
