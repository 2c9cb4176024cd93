package ambient

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func TestResolveClaims(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const ns = workloadapi.Service_NAMESPACE
	svc := func(ns, name string, age int) Claim {
		return Claim{Kind: KindService, Namespace: ns, Name: name, Created: day.AddDate(0, 0, -age)}
	}
	se := func(ns, name string, age int, v workloadapi.Service_Visibility) Claim {
		return Claim{Kind: KindServiceEntry, Namespace: ns, Name: name, Created: day.AddDate(0, 0, -age), Visibility: v}
	}
	for _, tt := range []struct {
		name   string
		claims []Claim
		// want is, per claim, "holds" or the owner it lost to.
		want []string
	}{
		{"a lone claim holds", []Claim{se("a", "x", 1, 0)}, []string{"holds"}},
		{"a Service beats an older ServiceEntry", []Claim{se("attacker", "grab", 100, 0), svc("shop", "echo", 1)},
			[]string{"Service shop/echo", "holds"}},
		{"a Service beats a ServiceEntry visible only in its own namespace", []Claim{se("attacker", "grab", 100, ns), svc("shop", "echo", 1)},
			[]string{"Service shop/echo", "holds"}},
		{"a Service visible only in its namespace still owns its cluster IP", []Claim{svc("shop", "echo", 1), se("attacker", "grab", 100, 0)},
			[]string{"holds", "Service shop/echo"}},
		{"the older ServiceEntry wins", []Claim{se("b", "new", 1, 0), se("a", "old", 2, 0)},
			[]string{"ServiceEntry a/old", "holds"}},
		{"equal age: namespace then name", []Claim{se("b", "x", 1, 0), se("a", "y", 1, 0), se("a", "x", 1, 0)},
			[]string{"ServiceEntry a/x", "ServiceEntry a/x", "holds"}},
		{"namespace-visible entries of different namespaces share", []Claim{se("a", "x", 1, ns), se("b", "y", 2, ns)},
			[]string{"holds", "holds"}},
		{"namespace-visible entries of one namespace contend", []Claim{se("a", "x", 1, ns), se("a", "y", 2, ns)},
			[]string{"ServiceEntry a/y", "holds"}},
		{"a public entry contends with a namespace-visible one", []Claim{se("a", "x", 1, ns), se("b", "y", 2, 0)},
			[]string{"ServiceEntry b/y", "holds"}},
		{"an older namespace-visible entry keeps it from a public one", []Claim{se("a", "x", 2, ns), se("b", "y", 1, 0)},
			[]string{"holds", "ServiceEntry a/x"}},
		{"a loser does not block later claims", []Claim{se("a", "x", 3, ns), se("c", "z", 1, ns), se("a", "y", 2, ns)},
			[]string{"holds", "holds", "ServiceEntry a/x"}},
		{"the hosts of one entry share its addresses", []Claim{se("a", "x", 1, 0), se("a", "x", 1, 0), se("b", "y", 0, 0)},
			[]string{"holds", "holds", "ServiceEntry a/x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, o := range Resolve(tt.claims) {
				if o.Holds {
					got = append(got, "holds")
				} else {
					got = append(got, o.LostTo.Owner())
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Resolve() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExportOf(t *testing.T) {
	t.Parallel()
	const pub, nsOnly = workloadapi.Service_PUBLIC, workloadapi.Service_NAMESPACE
	for _, tt := range []struct {
		name     string
		exportTo []string
		defaults []string
		want     Export
	}{
		{"unset is the mesh default, everywhere", nil, nil, Export{Published: true, Visibility: pub}},
		{"unset follows a narrower mesh default", nil, []string{"."}, Export{Published: true, Visibility: nsOnly}},
		{"set wins over the mesh default", []string{"*"}, []string{"."}, Export{Published: true, Visibility: pub}},
		{"dot is the own namespace", []string{"."}, nil, Export{Published: true, Visibility: nsOnly}},
		{"the own namespace by name", []string{"shop"}, nil, Export{Published: true, Visibility: nsOnly}},
		{"tilde is nowhere", []string{"~"}, nil, Export{}},
		{"star among others is everywhere", []string{"other", "*"}, nil, Export{Published: true, Visibility: pub}},
		{"annotation spacing", []string{" . ", ""}, nil, Export{Published: true, Visibility: nsOnly}},
		{"other namespaces narrow to the own one", []string{".", "front", "back"}, nil, Export{Published: true, Visibility: nsOnly,
			Warning: "exportTo names namespaces front, back: node proxies can limit a service only to its own namespace, so it is visible in namespace shop only"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ExportOf(tt.exportTo, "shop", Config{DefaultExportTo: tt.defaults})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ExportOf() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCanonicalClaim follows istiod's selectWorkloadServices
// (pilot/pkg/serviceregistry/ambient/services.go): of the services sharing
// a hostname across namespaces, a Kubernetes Service is canonical; else the
// oldest ServiceEntry not visible only in its own namespace; else none.
func TestCanonicalClaim(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const nsOnly = workloadapi.Service_NAMESPACE
	svc := func(ns string, age int, v workloadapi.Service_Visibility) Claim {
		return Claim{Kind: KindService, Namespace: ns, Name: "echo", Created: day.AddDate(0, 0, -age), Visibility: v}
	}
	se := func(ns string, age int, v workloadapi.Service_Visibility) Claim {
		return Claim{Kind: KindServiceEntry, Namespace: ns, Name: "ext", Created: day.AddDate(0, 0, -age), Visibility: v}
	}
	for _, tt := range []struct {
		name   string
		claims []Claim
		want   int // -1: none
	}{
		{"a lone entry", []Claim{se("a", 1, 0)}, 0},
		{"the oldest entry", []Claim{se("a", 1, 0), se("b", 3, 0), se("c", 2, 0)}, 1},
		{"equal age: the first namespace", []Claim{se("b", 1, 0), se("a", 1, 0)}, 1},
		{"a Service over an older entry", []Claim{se("a", 9, 0), svc("shop", 1, 0)}, 1},
		{"a Service visible in its namespace only", []Claim{se("a", 9, 0), svc("shop", 1, nsOnly)}, 1},
		{"namespace-visible entries are skipped", []Claim{se("a", 9, nsOnly), se("b", 1, 0)}, 1},
		{"only namespace-visible entries", []Claim{se("a", 9, nsOnly), se("b", 1, nsOnly)}, -1},
		{"none", nil, -1},
	} {
		got, ok := CanonicalClaim("api.example.com", tt.claims, Config{})
		if !ok {
			got = -1
		}
		if got != tt.want {
			t.Errorf("%s: CanonicalClaim() = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestCanonicalClaimOfAServiceName: a ServiceEntry of namespace attacker
// whose host is prod's Service name payments.prod.svc.cluster.local is
// never canonical, not even alone (istiod would mark it while prod has no
// Service of that name); prod's own ServiceEntry of that name may be.
func TestCanonicalClaimOfAServiceName(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const host = "payments.prod.svc.cluster.local"
	se := func(ns string, age int) Claim {
		return Claim{Kind: KindServiceEntry, Namespace: ns, Name: "payments", Created: day.AddDate(0, 0, -age)}
	}
	service := Claim{Kind: KindService, Namespace: "prod", Name: "payments", Created: day}
	for _, tt := range []struct {
		name   string
		claims []Claim
		want   int // -1: none
	}{
		{"the Service over an older copy", []Claim{se("attacker", 9), service}, 1},
		{"a lone copy", []Claim{se("attacker", 9)}, -1},
		{"copies of two namespaces", []Claim{se("aaa", 9), se("attacker", 3)}, -1},
		{"prod's own entry", []Claim{se("attacker", 9), se("prod", 1)}, 1},
	} {
		got, ok := CanonicalClaim(host, tt.claims, Config{})
		if !ok {
			got = -1
		}
		if got != tt.want {
			t.Errorf("%s: CanonicalClaim() = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestForeignServiceHost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		host, ns string
		domain   string
		want     bool
	}{
		{"payments.prod.svc.cluster.local", "attacker", "", true},
		{"payments.prod.svc.cluster.local", "prod", "", false},
		{"Payments.PROD.svc.cluster.local.", "attacker", "", true},
		{"a.b.prod.svc.cluster.local", "attacker", "", true},
		{"*.prod.svc.cluster.local", "attacker", "", true},
		{"*.prod.svc.cluster.local", "prod", "", false},
		{"*.svc.cluster.local", "prod", "", true},
		{"*.cluster.local", "prod", "", true},
		{"*.local", "prod", "", true},
		{"svc.cluster.local", "prod", "", false},
		{"api.example.com", "attacker", "", false},
		{"*.example.com", "attacker", "", false},
		{"payments.prod.svc.cluster.local", "attacker", "corp.example", false},
		{"payments.prod.svc.corp.example", "attacker", "corp.example", true},
		{"payments.prodsvc.cluster.local", "attacker", "", false},
	} {
		if got := ForeignServiceHost(tt.host, tt.ns, Config{DomainSuffix: tt.domain}); got != tt.want {
			t.Errorf("ForeignServiceHost(%q, %q, domain %q) = %v, want %v", tt.host, tt.ns, tt.domain, got, tt.want)
		}
	}
}
