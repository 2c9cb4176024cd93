package index

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

func selectorPolicy(ns, name string, lbls map[string]string) *securityv1.AuthorizationPolicy {
	p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	p.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: lbls}
	p.Spec.Rules = []*securityapi.Rule{{}}
	return p
}

// TestIndexWorkloadPolicyOrder checks the order of a workload's
// authorization_policies: istiod's buildWorkloadPolicies
// (pilot/pkg/serviceregistry/ambient/workloads.go) sorts the keys of the
// AuthorizationPolicies that select the workload, then appends the keys
// convertedSelectorPeerAuthentications gives for its PeerAuthentications
// (sorted among themselves), so the static strict policy comes last even
// where it sorts first.
func TestIndexWorkloadPolicyOrder(t *testing.T) {
	x := New(ambient.Config{})
	lbls := map[string]string{"app": "echo"}
	x.UpsertPod(pod("a", "n1", lbls, "10.244.1.5"))
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "shop", Labels: lbls}}
	we.Spec.Address = "10.10.1.1"
	x.UpsertWorkloadEntry(we)
	for _, p := range []*securityv1.AuthorizationPolicy{
		selectorPolicy("shop", "zz-allow", lbls),
		selectorPolicy("shop", "aa-deny", lbls),
		selectorPolicy("istio-system", "root-allow", lbls),
	} {
		x.UpsertAuthorizationPolicy(p)
	}
	mesh := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "istio-system"}}
	mesh.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}
	x.UpsertPeerAuthentication(mesh)

	want := []string{"istio-system/root-allow", "shop/aa-deny", "shop/zz-allow", "istio-system/istio_converted_static_strict"}
	for _, uid := range []string{podA, "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"} {
		if diff := cmp.Diff(want, x.Address(uid).GetWorkload().GetAuthorizationPolicies()); diff != "" {
			t.Errorf("%s authorization_policies (-want +got):\n%s", uid, diff)
		}
	}
}
