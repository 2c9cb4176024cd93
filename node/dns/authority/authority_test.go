package authority

import (
	"fmt"
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

// TestServiceEntryCannotShadowAService is the attack of issue 33's
// finding 2: whoever may write ServiceEntries in namespace attacker
// declares host payments.prod.svc.cluster.local with an address of its
// own. The Kubernetes Service prod/payments (canonical, as the controller
// sends it) must answer its name for every namespace but attacker, whose
// own entry overrides it for its own pods only (ztunnel's order: the
// client's namespace, then canonical). Namespaces aaa and zzz sort before
// and after the others; before the fix, the first service by namespace
// answered them, attacker's.
func TestServiceEntryCannotShadowAService(t *testing.T) {
	t.Parallel()
	const (
		host       = "payments.prod.svc.cluster.local"
		serviceVIP = "10.96.0.80"
		entryVIP   = "240.240.6.6"
	)
	payments := service("prod", host, serviceVIP)
	payments.Canonical = true
	grab := service("attacker", host, entryVIP)
	wild := service("attacker", "*.prod.svc.cluster.local", "240.240.6.7")
	namespaces := []string{"aaa", "attacker", "prod", "zzz"}
	// answered asks name from a pod of each namespace and returns the
	// addresses it got, by namespace ("none" when not the mesh's).
	answered := func(tbl table, name func(ns string) string) map[string]string {
		out := map[string]string{}
		for _, ns := range namespaces {
			got, ok := Lookup(tbl, "", Client{Namespace: ns}, name(ns), IPv4)
			switch {
			case !ok:
				out[ns] = "none"
			default:
				out[ns] = fmt.Sprint(got.Addrs)
			}
		}
		return out
	}
	withService := table{svcs: []*workloadapi.Service{grab, wild, payments}}
	want := map[string]string{"aaa": "[" + serviceVIP + "]", "attacker": "[" + entryVIP + "]", "prod": "[" + serviceVIP + "]", "zzz": "[" + serviceVIP + "]"}
	for _, q := range []struct {
		name string
		q    func(ns string) string
	}{
		{"full name", func(string) string { return host + "." }},
		{"name.namespace", func(string) string { return "payments.prod" }},
		{"name.namespace.svc", func(string) string { return "payments.prod.svc" }},
		{"through the ndots walk", func(ns string) string { return "payments.prod." + ns + ".svc.cluster.local" }},
	} {
		if diff := cmp.Diff(want, answered(withService, q.q)); diff != "" {
			t.Errorf("%s, with the Service: addresses by the client's namespace (-want +got):\n%s", q.name, diff)
		}
	}
	// prod's own pods ask the short name.
	if got, _ := Lookup(withService, "", Client{Namespace: "prod"}, "payments", IPv4); fmt.Sprint(got.Addrs) != "["+serviceVIP+"]" {
		t.Errorf("payments from prod = %v, want %s", got.Addrs, serviceVIP)
	}

	// No Service of that name (not created yet, or being recreated), and
	// the entry marked canonical as istiod marks the oldest ServiceEntry:
	// prod's names still are not attacker's to give to other namespaces.
	canonicalGrab := service("attacker", host, entryVIP)
	canonicalGrab.Canonical = true
	without := table{svcs: []*workloadapi.Service{canonicalGrab, wild}}
	want = map[string]string{"aaa": "none", "attacker": "[" + entryVIP + "]", "prod": "none", "zzz": "none"}
	if diff := cmp.Diff(want, answered(without, func(string) string { return host })); diff != "" {
		t.Errorf("without the Service: addresses by the client's namespace (-want +got):\n%s", diff)
	}
	// A wildcard covering prod's names is attacker's alone too.
	want = map[string]string{"aaa": "none", "attacker": "[240.240.6.7]", "prod": "none", "zzz": "none"}
	if diff := cmp.Diff(want, answered(without, func(string) string { return "new.prod.svc.cluster.local" })); diff != "" {
		t.Errorf("a name under the wildcard: addresses by the client's namespace (-want +got):\n%s", diff)
	}
}

// TestLookupPrefersCanonical: among services sharing a hostname none of
// which is the client's namespace's, the canonical one answers, wherever
// it sorts; without one, the first by namespace.
func TestLookupPrefersCanonical(t *testing.T) {
	t.Parallel()
	older := service("mmm", "api.example.com", "240.240.0.2")
	older.Canonical = true
	tbl := table{svcs: []*workloadapi.Service{service("bbb", "api.example.com", "240.240.0.1"), older}}
	for _, tt := range []struct {
		ns   string
		want string
	}{
		{"aaa", "240.240.0.2"},
		{"zzz", "240.240.0.2"},
		{"bbb", "240.240.0.1"}, // its own namespace's first
	} {
		got, ok := Lookup(tbl, "", Client{Namespace: tt.ns}, "api.example.com", IPv4)
		if !ok || fmt.Sprint(got.Addrs) != "["+tt.want+"]" {
			t.Errorf("api.example.com from %s = %v, %v; want %s", tt.ns, got.Addrs, ok, tt.want)
		}
	}
	older.Canonical = false
	if got, _ := Lookup(tbl, "", Client{Namespace: "zzz"}, "api.example.com", IPv4); fmt.Sprint(got.Addrs) != "[240.240.0.1]" {
		t.Errorf("without a canonical one: %v, want the first by namespace", got.Addrs)
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
