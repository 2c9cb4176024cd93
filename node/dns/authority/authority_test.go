package authority

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// table is Services over a list, for tests.
type table struct {
	svcs      []*workloadapi.Service
	workloads map[string][]*workloadapi.Workload
}

func (t table) ByHostname(host string) []*workloadapi.Service {
	var out []*workloadapi.Service
	for _, s := range t.svcs {
		if strings.EqualFold(s.GetHostname(), host) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *workloadapi.Service) int { return strings.Compare(a.GetNamespace(), b.GetNamespace()) })
	return out
}

func (t table) ServiceWorkloads(key string) []*workloadapi.Workload { return t.workloads[key] }

func service(ns, host string, ips ...string) *workloadapi.Service {
	s := &workloadapi.Service{Name: strings.Split(host, ".")[0], Namespace: ns, Hostname: host}
	for _, ip := range ips {
		s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: netip.MustParseAddr(ip).AsSlice()})
	}
	return s
}

func pod(ips ...string) *workloadapi.Workload {
	w := &workloadapi.Workload{}
	for _, ip := range ips {
		w.Addresses = append(w.Addresses, netip.MustParseAddr(ip).AsSlice())
	}
	return w
}

func addrs(ips ...string) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		out = append(out, netip.MustParseAddr(ip))
	}
	return out
}

func TestLookup(t *testing.T) {
	t.Parallel()
	private := service("other", "private.other.svc.cluster.local", "10.96.0.30")
	private.Visibility = workloadapi.Service_NAMESPACE
	v4only := service("demo", "v4.demo.svc.cluster.local", "10.96.0.40")
	v4only.IpFamilies = workloadapi.IPFamilies_IPV4_ONLY
	remote := service("demo", "remote.demo.svc.cluster.local")
	remote.Addresses = []*workloadapi.NetworkAddress{{Network: "west", Address: netip.MustParseAddr("10.96.0.50").AsSlice()}}
	tbl := table{
		svcs: []*workloadapi.Service{
			service("demo", "echo.demo.svc.cluster.local", "10.96.0.10", "fd00::10"),
			service("other", "echo.other.svc.cluster.local", "10.96.0.20"),
			private,
			v4only,
			remote,
			service("demo", "db.demo.svc.cluster.local"), // headless
			service("demo", "api.example.com", "240.240.0.1", "2001:2::1"),
			service("other", "api.example.com", "240.240.0.2"),
			service("demo", "*.wild.example.com", "240.240.0.3"),
			service("demo", "noaddr.example.com"), // a ServiceEntry without addresses
		},
		workloads: map[string][]*workloadapi.Workload{
			"demo/db.demo.svc.cluster.local": {pod("10.244.1.5", "fd00::5"), pod("fd00::6", "10.244.1.6"), pod("fd00::7")},
		},
	}
	demo := Client{Namespace: "demo"}
	tests := []struct {
		name   string
		client Client
		q      string
		fam    Family
		want   Answer
		found  bool
	}{
		{"full name", demo, "echo.demo.svc.cluster.local.", IPv4, Answer{Addrs: addrs("10.96.0.10")}, true},
		{"any case, no final dot", demo, "Echo.DEMO.svc.cluster.local", IPv6, Answer{Addrs: addrs("fd00::10")}, true},
		{"short name in the client's namespace", demo, "echo", IPv4, Answer{Addrs: addrs("10.96.0.10")}, true},
		{"another namespace's service", demo, "echo.other", IPv4, Answer{Addrs: addrs("10.96.0.20")}, true},
		{"with svc", demo, "echo.other.svc", IPv4, Answer{Addrs: addrs("10.96.0.20")}, true},
		{"ndots walk, first step", demo, "echo.other.demo.svc.cluster.local", IPv4, Answer{CNAME: "echo.other", Addrs: addrs("10.96.0.20")}, true},
		{"ServiceEntry host through the walk", demo, "api.example.com.demo.svc.cluster.local", IPv4, Answer{CNAME: "api.example.com", Addrs: addrs("240.240.0.1")}, true},
		{"ServiceEntry host, own namespace first", demo, "api.example.com", IPv6, Answer{Addrs: addrs("2001:2::1")}, true},
		{"ServiceEntry host from a third namespace", Client{Namespace: "third"}, "api.example.com", IPv4, Answer{Addrs: addrs("240.240.0.1")}, true},
		{"wildcard host", demo, "www.wild.example.com", IPv4, Answer{Addrs: addrs("240.240.0.3")}, true},
		{"wildcard through the walk: no CNAME", demo, "www.wild.example.com.svc.cluster.local", IPv4, Answer{Addrs: addrs("240.240.0.3")}, true},
		{"known name, no address of the family", demo, "echo.other.svc.cluster.local", IPv6, Answer{}, true},
		{"IPv4-only service asked AAAA", demo, "v4", IPv6, Answer{}, true},
		{"headless: each endpoint's first address of the family", demo, "db", IPv4, Answer{Addrs: addrs("10.244.1.5", "10.244.1.6")}, true},
		{"headless AAAA", demo, "db", IPv6, Answer{Addrs: addrs("fd00::5", "fd00::6", "fd00::7")}, true},
		{"VIPs of another network are not answered", demo, "remote", IPv4, Answer{}, true},
		{"VIPs of the client's network", Client{Namespace: "demo", Network: "west"}, "remote", IPv4, Answer{Addrs: addrs("10.96.0.50")}, true},
		{"namespace-private service, its own namespace", Client{Namespace: "other"}, "private", IPv4, Answer{Addrs: addrs("10.96.0.30")}, true},
		{"namespace-private service, another namespace", demo, "private.other", IPv4, Answer{}, false},
		{"ServiceEntry without addresses goes upstream", demo, "noaddr.example.com", IPv4, Answer{}, false},
		{"not the mesh's", demo, "example.org", IPv4, Answer{}, false},
		{"unknown short name", demo, "nope", IPv4, Answer{}, false},
		{"root", demo, ".", IPv4, Answer{}, false},
		{"empty label", demo, "echo..demo", IPv4, Answer{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := Lookup(tbl, "", tt.client, tt.q, tt.fam)
			if found != tt.found {
				t.Fatalf("Lookup(%q) found = %v, want %v", tt.q, found, tt.found)
			}
			got.Service = nil
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("Lookup(%q) (-want +got):\n%s", tt.q, diff)
			}
		})
	}
}

func TestClusterDomain(t *testing.T) {
	t.Parallel()
	tbl := table{svcs: []*workloadapi.Service{service("demo", "echo.demo.svc.corp.example", "10.96.0.10")}}
	for _, q := range []string{"echo", "echo.demo", "echo.demo.svc", "echo.demo.svc.corp.example"} {
		if got, ok := Lookup(tbl, "corp.example", Client{Namespace: "demo"}, q, IPv4); !ok || len(got.Addrs) != 1 {
			t.Errorf("Lookup(%q) under corp.example = %v, %v", q, got, ok)
		}
	}
	if _, ok := Lookup(tbl, "", Client{Namespace: "demo"}, "echo", IPv4); ok {
		t.Error("echo found under the default cluster domain")
	}
}

// FuzzLookup: any name, never a panic; an answer's addresses are of the
// family asked and its CNAME is a suffix-stripped form of the query.
func FuzzLookup(f *testing.F) {
	tbl := table{
		svcs: []*workloadapi.Service{
			service("demo", "echo.demo.svc.cluster.local", "10.96.0.10", "fd00::10"),
			service("demo", "*.example.com", "240.240.0.3"),
			service("demo", "db.demo.svc.cluster.local"),
		},
		workloads: map[string][]*workloadapi.Workload{"demo/db.demo.svc.cluster.local": {pod("10.244.1.5")}},
	}
	for _, s := range []string{"echo", "a.example.com.demo.svc.cluster.local", "db.demo", "..", "*.", "x.svc"} {
		f.Add(s, "demo", true)
	}
	f.Fuzz(func(t *testing.T, q, ns string, v6 bool) {
		fam := IPv4
		if v6 {
			fam = IPv6
		}
		ans, found := Lookup(tbl, "", Client{Namespace: ns}, q, fam)
		if !found {
			return
		}
		for _, a := range ans.Addrs {
			if a.Is4() != (fam == IPv4) {
				t.Fatalf("Lookup(%q, %v) answered %v", q, fam, a)
			}
		}
		if ans.CNAME != "" && !strings.HasPrefix(strings.ToLower(q), ans.CNAME) {
			t.Fatalf("Lookup(%q) CNAME %q is not the query with a suffix stripped", q, ans.CNAME)
		}
	})
}
