package sidecar

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1"

	goldenfile "github.com/canopy-mesh/canopy/internal/testing/golden"
)

// TestFieldUses: every field of the networking API kinds sidecars read,
// from the API's own descriptors, with what Canopy does with it
// (testdata/fields.golden, -update). A field the API adds shows here
// first, as translated until it is classified.
func TestFieldUses(t *testing.T) {
	var b strings.Builder
	for _, kind := range []string{"DestinationRule", "ServiceEntry", "Sidecar", "VirtualService", "WorkloadEntry"} {
		b.WriteString("# " + kind + "\n")
		for _, f := range FieldUses(kind) {
			b.WriteString(f + "\n")
		}
	}
	goldenfile.Check(t, "fields.golden", []byte(b.String()))
	for kind, uses := range fieldUses {
		for path := range uses {
			if !strings.Contains(b.String(), "\n"+path+" ") {
				t.Errorf("%s: %s is classified but is no field", kind, path)
			}
		}
	}
}

// TestUntranslatedFieldsAreSaid: an object that sets a field Canopy does
// not translate gets a problem naming it (the top of the subtree only),
// and one that sets none gets none.
func TestUntranslatedFieldsAreSaid(t *testing.T) {
	sc := &networkingapi.Sidecar{
		Egress:                []*networkingapi.IstioEgressListener{{Hosts: []string{"./*"}, Port: &networkingapi.SidecarPort{Number: 80}}},
		Ingress:               []*networkingapi.IstioIngressListener{{Port: &networkingapi.SidecarPort{Number: 8080}, DefaultEndpoint: "127.0.0.1:8080"}},
		OutboundTrafficPolicy: &networkingapi.OutboundTrafficPolicy{Mode: networkingapi.OutboundTrafficPolicy_REGISTRY_ONLY},
	}
	if diff := cmp.Diff([]string{"egress.port", "ingress", "outboundTrafficPolicy"}, UntranslatedFields("Sidecar", sc)); diff != "" {
		t.Errorf("untranslated fields (-want +got):\n%s", diff)
	}
	pool := &networkingapi.Sidecar{InboundConnectionPool: &networkingapi.ConnectionPoolSettings{Http: &networkingapi.ConnectionPoolSettings_HTTPSettings{MaxRetries: 1}}}
	if got := UntranslatedFields("Sidecar", pool); len(got) != 0 {
		t.Errorf("a translated field is said to be untranslated: %v", got)
	}
}
