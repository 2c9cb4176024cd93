package index

import (
	"strings"
	"testing"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// TestIndexConfigProblems: what sidecars do not get of a VirtualService, a
// DestinationRule or a ServiceEntry that Istio's rules refuse is recorded
// by object, follows its updates and goes with it.
func TestIndexConfigProblems(t *testing.T) {
	t.Parallel()
	x := New(ambient.Config{})
	route := func(uri *networkingapi.StringMatch) []*networkingapi.HTTPRoute {
		return []*networkingapi.HTTPRoute{{Match: []*networkingapi.HTTPMatchRequest{{Uri: uri}},
			Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "ratings"}}}}}
	}
	bad := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: "attacker", Name: "ratings"},
		Spec: networkingapi.VirtualService{Hosts: []string{"ratings"}, Http: route(&networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: "("}})}}
	x.UpsertVirtualService(bad)
	x.UpsertDestinationRule(&networkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: "attacker", Name: "ratings"},
		Spec: networkingapi.DestinationRule{Host: "rat*ings"}})
	x.UpsertDestinationRule(&networkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "reviews"},
		Spec: networkingapi.DestinationRule{Host: "reviews"}})
	x.UpsertServiceEntry(&networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "attacker", Name: "ext"},
		Spec: networkingapi.ServiceEntry{Hosts: []string{"a*b.example.com"}, Ports: []*networkingapi.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}}})
	got := x.ConfigProblems()
	for k, want := range map[string]string{
		"VirtualService attacker/ratings":  `sidecars do not get HTTP route 0: "uri": error parsing regexp: missing closing )`,
		"DestinationRule attacker/ratings": `sidecars that would use this rule get no cluster for host "rat*ings"`,
		"ServiceEntry attacker/ext":        `host "a*b.example.com" is not sent to sidecars`,
	} {
		if !strings.Contains(got[k], want) {
			t.Errorf("ConfigProblems()[%q] = %q, want it to contain %q", k, got[k], want)
		}
	}
	if len(got) != 3 {
		t.Errorf("ConfigProblems() has %d objects, want 3: %v", len(got), got)
	}

	fixed := bad.DeepCopy()
	fixed.Spec.Http = route(&networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Prefix{Prefix: "/"}})
	x.UpsertVirtualService(fixed)
	x.DeleteDestinationRule("attacker", "ratings")
	x.DeleteServiceEntry("attacker", "ext")
	if got := x.ConfigProblems(); len(got) != 0 {
		t.Errorf("problems left after the fix and the deletes: %v", got)
	}
}
