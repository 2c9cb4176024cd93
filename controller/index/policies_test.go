package index

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/securitypolicy"
	"github.com/canopy-mesh/canopy/workloadapi/security"
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
	// A ServiceEntry's endpoints are selected by its labels; a DNS entry
	// without endpoints has one workload per host.
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "shop", Labels: lbls}}
	se.Spec.Hosts = []string{"api.example.com"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	se.Spec.Resolution = networkingapi.ServiceEntry_DNS
	x.UpsertServiceEntry(se)
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
	implicit := "Kubernetes/networking.istio.io/ServiceEntry/shop/ext/api.example.com"
	for _, uid := range []string{podA, "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1", implicit} {
		if diff := cmp.Diff(want, x.Address(uid).GetWorkload().GetAuthorizationPolicies()); diff != "" {
			t.Errorf("%s authorization_policies (-want +got):\n%s", uid, diff)
		}
	}
}

// TestIndexServiceEntryEndpointPolicies: a ServiceEntry's endpoints follow
// the policies and PeerAuthentications that select the ServiceEntry's
// labels as they come and go.
func TestIndexServiceEntryEndpointPolicies(t *testing.T) {
	x := New(ambient.Config{})
	lbls := map[string]string{"app": "ext"}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "shop", Labels: lbls}}
	se.Spec.Hosts = []string{"api.example.com"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.0.5"}}
	x.UpsertServiceEntry(se)
	ep := "Kubernetes/networking.istio.io/ServiceEntry/shop/ext/10.10.0.5"
	policies := func() []string { return x.Address(ep).GetWorkload().GetAuthorizationPolicies() }

	check(t, "policy selecting the entry's labels", x.UpsertAuthorizationPolicy(selectorPolicy("shop", "allow-ext", lbls)), ChangeSet{
		Addresses:      Changes{Updated: []string{ep}},
		Authorizations: Changes{Added: []string{"shop/allow-ext"}},
	})
	ns := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "strict", Namespace: "shop"}}
	ns.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}
	x.UpsertPeerAuthentication(ns)
	if diff := cmp.Diff([]string{"shop/allow-ext", "istio-system/istio_converted_static_strict"}, policies()); diff != "" {
		t.Errorf("endpoint policies (-want +got):\n%s", diff)
	}
	check(t, "policy deleted", x.DeleteAuthorizationPolicy("shop", "allow-ext"), ChangeSet{
		Addresses:      Changes{Updated: []string{ep}},
		Authorizations: Changes{Removed: []string{"shop/allow-ext"}},
	})
	x.DeletePeerAuthentication("shop", "strict")
	if got := policies(); len(got) != 0 {
		t.Errorf("endpoint policies after the PeerAuthentication went = %v", got)
	}
}

// TestIndexUnlabelledEntryPolicies: a WorkloadEntry or ServiceEntry
// without labels lists every selector-bound policy of its namespace and
// the root namespace, whatever the selector, as istiod does; a pod without
// labels lists none of them, and neither do entries of other namespaces.
func TestIndexUnlabelledEntryPolicies(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertPod(pod("a", "n1", nil, "10.244.1.5"))
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "shop"}}
	we.Spec.Address = "10.10.1.1"
	x.UpsertWorkloadEntry(we)
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "shop"}}
	se.Spec.Hosts = []string{"api.example.com"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.0.5", Labels: map[string]string{"app": "ext"}}}
	x.UpsertServiceEntry(se)
	other := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-2", Namespace: "other"}}
	other.Spec.Address = "10.10.1.2"
	x.UpsertWorkloadEntry(other)

	weUID := "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"
	epUID := "Kubernetes/networking.istio.io/ServiceEntry/shop/ext/10.10.0.5"
	otherUID := "Kubernetes/networking.istio.io/WorkloadEntry/other/vm-2"
	check(t, "policy selecting other labels", x.UpsertAuthorizationPolicy(selectorPolicy("shop", "allow-web", map[string]string{"app": "web"})), ChangeSet{
		Addresses:      Changes{Updated: []string{epUID, weUID}},
		Authorizations: Changes{Added: []string{"shop/allow-web"}},
	})
	x.UpsertAuthorizationPolicy(selectorPolicy("istio-system", "root-web", map[string]string{"app": "web"}))
	// Policies without a selector are not listed on any workload.
	ns := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "ns-wide", Namespace: "shop"}}
	x.UpsertAuthorizationPolicy(ns)

	for _, tt := range []struct {
		uid  string
		want []string
	}{
		{podA, nil},
		{weUID, []string{"istio-system/root-web", "shop/allow-web"}},
		{epUID, []string{"istio-system/root-web", "shop/allow-web"}},
		{otherUID, []string{"istio-system/root-web"}},
	} {
		if diff := cmp.Diff(tt.want, x.Address(tt.uid).GetWorkload().GetAuthorizationPolicies()); diff != "" {
			t.Errorf("%s authorization_policies (-want +got):\n%s", tt.uid, diff)
		}
	}
	check(t, "policy deleted", x.DeleteAuthorizationPolicy("shop", "allow-web"), ChangeSet{
		Addresses:      Changes{Updated: []string{epUID, weUID}},
		Authorizations: Changes{Removed: []string{"shop/allow-web"}},
	})
}

// TestIndexCustomPolicyFailsClosed, written as the attack: a CUSTOM policy
// protecting a pod reached no node proxy and no sidecar (no sidecar
// change), so what it protects was open. Now the pod lists it, its
// Authorization denies, the sidecar tables are recomputed, and the
// policy's problem says why.
func TestIndexCustomPolicyFailsClosed(t *testing.T) {
	x := New(ambient.Config{})
	lbls := map[string]string{"app": "admin"}
	x.UpsertPod(pod("a", "n1", lbls, "10.244.1.5"))
	p := selectorPolicy("shop", "ext-authz", lbls)
	p.Spec.Action = securityapi.AuthorizationPolicy_CUSTOM
	p.Spec.Rules = []*securityapi.Rule{{To: []*securityapi.Rule_To{{Operation: &securityapi.Operation{Paths: []string{"/admin*"}}}}}}
	cs := x.UpsertAuthorizationPolicy(p)
	if !cs.SidecarInputs {
		t.Error("a CUSTOM policy did not recompute sidecar tables")
	}
	if diff := cmp.Diff([]string{"shop/ext-authz"}, x.Address(podA).GetWorkload().GetAuthorizationPolicies()); diff != "" {
		t.Errorf("authorization_policies (-want +got):\n%s", diff)
	}
	if got := x.Authorization("shop/ext-authz").GetAction(); got != security.Action_DENY {
		t.Errorf("action %s, want DENY", got)
	}
	if msg := x.Problems()["AuthorizationPolicy shop/ext-authz"]; !strings.Contains(msg, securitypolicy.CustomAsDeny) {
		t.Errorf("problem %q, want it to say %q", msg, securitypolicy.CustomAsDeny)
	}
}
