package sidecar

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestServiceEntryCannotTakeAServiceName is issue 33's finding 2 for
// sidecars: a ServiceEntry of namespace attacker with host
// payments.prod.svc.cluster.local. Beside prod's Service, the Service
// (canonical) is every proxy's, attacker's own included. Without the
// Service (not created yet, or being recreated), the copy is only
// attacker's, even marked canonical as istiod marks the oldest
// ServiceEntry: before the fix, every proxy of the mesh took it for
// prod's name.
func TestServiceEntryCannotTakeAServiceName(t *testing.T) {
	t.Parallel()
	const host = "payments.prod.svc.cluster.local"
	service := func(ns, name string, canonical bool) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: name, Namespace: ns, Hostname: host, Canonical: canonical,
			Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}}
	}
	namespaces := []string{"aaa", "attacker", "prod", "zzz"}
	seen := func(m *Mesh) map[string]string {
		out := map[string]string{}
		for _, ns := range namespaces {
			out[ns] = "none"
			if s := m.Service(Proxy{Namespace: ns}, host); s != nil {
				out[ns] = s.GetNamespace() + "/" + s.GetName()
			}
		}
		return out
	}
	for _, tt := range []struct {
		name  string
		addrs []*workloadapi.Address
		want  map[string]string
	}{
		{"beside the Service", []*workloadapi.Address{service("attacker", "grab", false), service("prod", "payments", true)},
			map[string]string{"aaa": "prod/payments", "attacker": "prod/payments", "prod": "prod/payments", "zzz": "prod/payments"}},
		{"alone", []*workloadapi.Address{service("attacker", "grab", false)},
			map[string]string{"aaa": "none", "attacker": "attacker/grab", "prod": "none", "zzz": "none"}},
		{"alone, marked canonical", []*workloadapi.Address{service("attacker", "grab", true)},
			map[string]string{"aaa": "none", "attacker": "attacker/grab", "prod": "none", "zzz": "none"}},
	} {
		if diff := cmp.Diff(tt.want, seen(NewMesh(Inputs{Addresses: tt.addrs}))); diff != "" {
			t.Errorf("%s: the service each namespace's proxies get for %s (-want +got):\n%s", tt.name, host, diff)
		}
	}
}
