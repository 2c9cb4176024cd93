package ambient

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/emptypb"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func policy(ns string, action securityapi.AuthorizationPolicy_Action, selector bool, rules ...*securityapi.Rule) *securityv1.AuthorizationPolicy {
	p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "pol", Namespace: ns}}
	p.Spec.Action = action
	p.Spec.Rules = rules
	if selector {
		p.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}}
	}
	return p
}

func from(s *securityapi.Source) *securityapi.Rule_From { return &securityapi.Rule_From{Source: s} }
func to(o *securityapi.Operation) *securityapi.Rule_To  { return &securityapi.Rule_To{Operation: o} }
func when(key string, values ...string) *securityapi.Condition {
	return &securityapi.Condition{Key: key, Values: values}
}

func TestBuildAuthorization(t *testing.T) {
	t.Parallel()
	const allow, deny = securityapi.AuthorizationPolicy_ALLOW, securityapi.AuthorizationPolicy_DENY
	for _, tt := range []struct {
		name         string
		policy       *securityv1.AuthorizationPolicy
		wantWarnings int
	}{
		{name: "selector policy is workload scoped", policy: policy("shop", allow, true, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{Principals: []string{"cluster.local/ns/shop/sa/web"}})},
		})},
		{name: "no selector is namespace scoped", policy: policy("shop", allow, false, &securityapi.Rule{})},
		{name: "root namespace is global", policy: policy("istio-system", deny, false, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{NotNamespaces: []string{"istio-system"}})},
		})},
		{name: "empty rule allows everything", policy: policy("shop", allow, true, &securityapi.Rule{})},
		{name: "no rules", policy: policy("shop", allow, true)},
		{name: "every source field", policy: policy("shop", allow, true, &securityapi.Rule{From: []*securityapi.Rule_From{
			from(&securityapi.Source{
				Principals: []string{"cluster.local/ns/a/sa/b"}, NotPrincipals: []string{"cluster.local/ns/a/sa/evil"},
				Namespaces: []string{"a"}, NotNamespaces: []string{"b"},
				IpBlocks: []string{"10.0.0.0/8", "192.168.1.7"}, NotIpBlocks: []string{"10.1.0.0/16", "fd00::/8"},
				ServiceAccounts: []string{"other/api", "local-sa"}, NotServiceAccounts: []string{"shop/banned"},
			}),
			from(&securityapi.Source{Namespaces: []string{"c"}}),
		}})},
		{name: "to ports", policy: policy("shop", allow, true, &securityapi.Rule{To: []*securityapi.Rule_To{
			to(&securityapi.Operation{Ports: []string{"8080", "9090"}}),
			to(&securityapi.Operation{NotPorts: []string{"22"}}),
		}})},
		{name: "when L4 keys", policy: policy("shop", allow, true, &securityapi.Rule{When: []*securityapi.Condition{
			when("source.ip", "10.0.0.1"), when("source.namespace", "a"), when("source.principal", "*/sa/b"),
			when("destination.ip", "10.96.0.0/12"), when("destination.port", "443"),
			{Key: "source.namespace", NotValues: []string{"kube-system"}},
		}})},
		// istiod's handleRule (pilot/pkg/serviceregistry/ambient/authorization.go)
		// emits the to clause, then the from clause, then one per condition.
		{name: "from to and when are separate clauses", policy: policy("shop", allow, true, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{Namespaces: []string{"a"}})},
			To:   []*securityapi.Rule_To{to(&securityapi.Operation{Ports: []string{"80"}})},
			When: []*securityapi.Condition{when("source.ip", "10.0.0.0/8")},
		})},
		{name: "wildcards", policy: policy("shop", allow, true, &securityapi.Rule{From: []*securityapi.Rule_From{from(&securityapi.Source{
			Principals: []string{"*", "*/sa/web", "cluster.local/ns/shop/*", "exact"},
			Namespaces: []string{"prod-*"},
		})}})},
		{name: "http attributes drop an ALLOW rule", wantWarnings: 1, policy: policy("shop", allow, true,
			&securityapi.Rule{To: []*securityapi.Rule_To{to(&securityapi.Operation{Methods: []string{"GET"}, Ports: []string{"80"}})}},
			&securityapi.Rule{From: []*securityapi.Rule_From{from(&securityapi.Source{Namespaces: []string{"a"}})}},
		)},
		{name: "ALLOW with only http rules matches nothing", wantWarnings: 1, policy: policy("shop", allow, true,
			&securityapi.Rule{To: []*securityapi.Rule_To{to(&securityapi.Operation{Paths: []string{"/admin"}})}},
		)},
		{name: "http attributes reduce a DENY rule to L4", wantWarnings: 1, policy: policy("shop", deny, true, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{Namespaces: []string{"a"}, RequestPrincipals: []string{"*"}})},
			To:   []*securityapi.Rule_To{to(&securityapi.Operation{Ports: []string{"80"}, Paths: []string{"/admin"}, Hosts: []string{"x"}})},
			When: []*securityapi.Condition{when("request.headers[x-user]", "bob"), when("destination.port", "80")},
		})},
		{name: "DENY with only http attributes denies at L4", wantWarnings: 1, policy: policy("shop", deny, true, &securityapi.Rule{
			To: []*securityapi.Rule_To{to(&securityapi.Operation{Methods: []string{"DELETE"}})},
		})},
		{name: "DENY source with only http attributes does not limit the rule", wantWarnings: 1, policy: policy("shop", deny, true, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{Namespaces: []string{"a"}}), from(&securityapi.Source{RequestPrincipals: []string{"*"}})},
			To:   []*securityapi.Rule_To{to(&securityapi.Operation{Ports: []string{"22"}})},
		})},
		{name: "dry run", policy: func() *securityv1.AuthorizationPolicy {
			p := policy("shop", deny, true, &securityapi.Rule{})
			p.Annotations = map[string]string{securitypolicy.AnnotationDryRun: "true"}
			return p
		}()},
		// The attack: an allow-all trial marked "True" was enforced (and
		// opened the workload) where istiod only logs it.
		{name: "dry run True", policy: func() *securityv1.AuthorizationPolicy {
			p := policy("shop", allow, true, &securityapi.Rule{})
			p.Annotations = map[string]string{securitypolicy.AnnotationDryRun: "True"}
			return p
		}()},
		{name: "dry run 1", policy: func() *securityv1.AuthorizationPolicy {
			p := policy("shop", allow, true, &securityapi.Rule{})
			p.Annotations = map[string]string{securitypolicy.AnnotationDryRun: "1"}
			return p
		}()},
		{name: "dry run unparsable is enforced", wantWarnings: 1, policy: func() *securityv1.AuthorizationPolicy {
			p := policy("shop", allow, true, &securityapi.Rule{})
			p.Annotations = map[string]string{securitypolicy.AnnotationDryRun: "yes"}
			return p
		}()},
		// The attack: /admin* protected by a CUSTOM policy was open, since
		// the policy reached no node proxy; as a DENY of its L4 part it
		// refuses every connection to the workloads it selects.
		{name: "CUSTOM is a DENY of its rules", wantWarnings: 2, policy: policy("shop", securityapi.AuthorizationPolicy_CUSTOM, true, &securityapi.Rule{
			To: []*securityapi.Rule_To{to(&securityapi.Operation{Paths: []string{"/admin*"}})},
		})},
		{name: "targetRefs are for waypoints", policy: func() *securityv1.AuthorizationPolicy {
			p := policy("shop", allow, false, &securityapi.Rule{})
			p.Spec.TargetRefs = []*typeapi.PolicyTargetReference{{Kind: "Service", Name: "echo"}}
			return p
		}()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := BuildAuthorization(tt.policy, Config{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Warnings) != tt.wantWarnings {
				t.Errorf("warnings = %q, want %d", res.Warnings, tt.wantWarnings)
			}
			checkGolden(t, "authorization/"+golden(tt.name), res.Authorization)
		})
	}
}

func TestBuildAuthorizationErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		policy *securityv1.AuthorizationPolicy
		want   string
	}{
		{"audit action", policy("shop", securityapi.AuthorizationPolicy_AUDIT, true), "AUDIT"},
		{"bad ip", policy("shop", securityapi.AuthorizationPolicy_ALLOW, true, &securityapi.Rule{
			From: []*securityapi.Rule_From{from(&securityapi.Source{IpBlocks: []string{"10.0.0.300"}})}}), "10.0.0.300"},
		{"bad cidr", policy("shop", securityapi.AuthorizationPolicy_ALLOW, true, &securityapi.Rule{
			When: []*securityapi.Condition{when("destination.ip", "10.0.0.0/33")}}), "10.0.0.0/33"},
		{"bad port", policy("shop", securityapi.AuthorizationPolicy_ALLOW, true, &securityapi.Rule{
			To: []*securityapi.Rule_To{to(&securityapi.Operation{Ports: []string{"http"}})}}), "http"},
		{"port zero", policy("shop", securityapi.AuthorizationPolicy_DENY, true, &securityapi.Rule{
			When: []*securityapi.Condition{when("destination.port", "0")}}), "port"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := BuildAuthorization(tt.policy, Config{})
			if !errors.Is(err, ErrUnsupportedPolicy) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("BuildAuthorization() error = %v, want ErrUnsupportedPolicy mentioning %q", err, tt.want)
			}
			checkGolden(t, "authorization-error/"+golden(tt.name), res.Authorization)
		})
	}
}

func peerAuth(ns string, selector bool, mode securityapi.PeerAuthentication_MutualTLS_Mode, ports map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode) *securityv1.PeerAuthentication {
	pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "mtls", Namespace: ns}}
	pa.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: mode}
	if selector {
		pa.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}}
	}
	for port, m := range ports {
		if pa.Spec.PortLevelMtls == nil {
			pa.Spec.PortLevelMtls = map[uint32]*securityapi.PeerAuthentication_MutualTLS{}
		}
		pa.Spec.PortLevelMtls[port] = &securityapi.PeerAuthentication_MutualTLS{Mode: m}
	}
	return pa
}

func TestBuildPeerAuthentication(t *testing.T) {
	t.Parallel()
	const strict, permissive, disable, unset = securityapi.PeerAuthentication_MutualTLS_STRICT, securityapi.PeerAuthentication_MutualTLS_PERMISSIVE,
		securityapi.PeerAuthentication_MutualTLS_DISABLE, securityapi.PeerAuthentication_MutualTLS_UNSET
	checkGolden(t, "peerauthentication/static-strict", StaticStrictPolicy(Config{}))
	for _, tt := range []struct {
		name      string
		pa        *securityv1.PeerAuthentication
		inherited securityapi.PeerAuthentication_MutualTLS_Mode
	}{
		{"namespace policy acts through the static policy", peerAuth("shop", false, strict, nil), permissive},
		{"selector policy without ports acts through the static policy", peerAuth("shop", true, strict, nil), permissive},
		{"selector strict with permissive ports", peerAuth("shop", true, strict, map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{9090: permissive, 8081: disable}), permissive},
		{"selector permissive with strict ports", peerAuth("shop", true, permissive, map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{8443: strict, 8080: strict}), permissive},
		{"selector unset inherits strict", peerAuth("shop", true, unset, map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{9090: permissive}), strict},
		{"selector permissive ports only", peerAuth("shop", true, permissive, map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{9090: disable}), permissive},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkGolden(t, "peerauthentication/"+golden(tt.name), BuildPeerAuthentication(tt.pa, tt.inherited))
		})
	}
}

func TestMTLSPolicyKey(t *testing.T) {
	t.Parallel()
	const strict, permissive, unset = securityapi.PeerAuthentication_MutualTLS_STRICT, securityapi.PeerAuthentication_MutualTLS_PERMISSIVE, securityapi.PeerAuthentication_MutualTLS_UNSET
	mesh := peerAuth("istio-system", false, strict, nil)
	for _, tt := range []struct {
		name    string
		p       securitypolicy.PeerAuthentications
		wantKey string
	}{
		{"nothing is permissive", securitypolicy.PeerAuthentications{}, ""},
		{"mesh strict", securitypolicy.PeerAuthentications{Mesh: mesh}, "istio-system/istio_converted_static_strict"},
		{"namespace permissive relaxes mesh strict", securitypolicy.PeerAuthentications{Mesh: mesh, Namespace: peerAuth("shop", false, permissive, nil)}, ""},
		{"namespace unset inherits", securitypolicy.PeerAuthentications{Mesh: mesh, Namespace: peerAuth("shop", false, unset, nil)}, "istio-system/istio_converted_static_strict"},
		{"workload strict in permissive namespace", securitypolicy.PeerAuthentications{Workload: peerAuth("shop", true, strict, nil), Namespace: peerAuth("shop", false, permissive, nil)}, "istio-system/istio_converted_static_strict"},
		{"workload permissive in strict mesh", securitypolicy.PeerAuthentications{Workload: peerAuth("shop", true, permissive, nil), Mesh: mesh}, ""},
		{"workload port-level uses its converted policy", securitypolicy.PeerAuthentications{Mesh: mesh,
			Workload: peerAuth("shop", true, unset, map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{9090: permissive})}, "shop/converted_peer_authentication_mtls"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := MTLSPolicyKey(tt.p, Config{}); got != tt.wantKey {
				t.Errorf("MTLSPolicyKey() = %q, want %q", got, tt.wantKey)
			}
		})
	}
}

// TestPeerAuthenticationClauses checks the layout of a converted
// PeerAuthentication: with a STRICT result, one rule of a no-identity
// clause (own STRICT), one "not to this port" clause per PERMISSIVE or
// DISABLE port, and a no-identity clause again when the inherited mode is
// STRICT; otherwise one rule per STRICT port.
func TestPeerAuthenticationClauses(t *testing.T) {
	t.Parallel()
	const strict, permissive, disable, unset = securityapi.PeerAuthentication_MutualTLS_STRICT, securityapi.PeerAuthentication_MutualTLS_PERMISSIVE,
		securityapi.PeerAuthentication_MutualTLS_DISABLE, securityapi.PeerAuthentication_MutualTLS_UNSET
	noID := func(ports ...uint32) *security.Clause {
		return &security.Clause{Matches: []*security.Match{{
			NotPrincipals:    []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
			DestinationPorts: ports,
		}}}
	}
	notTo := func(port uint32) *security.Clause {
		return &security.Clause{Matches: []*security.Match{{NotDestinationPorts: []uint32{port}}}}
	}
	relaxed := map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{9187: disable, 5432: permissive}
	for _, tt := range []struct {
		name      string
		mode      securityapi.PeerAuthentication_MutualTLS_Mode
		ports     map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode
		inherited securityapi.PeerAuthentication_MutualTLS_Mode
		want      []*security.Rule
	}{
		{name: "strict with relaxed ports", mode: strict, ports: relaxed, inherited: permissive,
			want: []*security.Rule{{Clauses: []*security.Clause{noID(), notTo(5432), notTo(9187)}}}},
		{name: "strict in a strict namespace", mode: strict, ports: relaxed, inherited: strict,
			want: []*security.Rule{{Clauses: []*security.Clause{noID(), notTo(5432), notTo(9187), noID()}}}},
		{name: "unset inheriting strict", mode: unset, ports: relaxed, inherited: strict,
			want: []*security.Rule{{Clauses: []*security.Clause{notTo(5432), notTo(9187), noID()}}}},
		{name: "permissive with strict ports", mode: permissive, inherited: strict,
			ports: map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{8443: strict, 8080: strict, 9090: disable},
			want:  []*security.Rule{{Clauses: []*security.Clause{noID(8080)}}, {Clauses: []*security.Clause{noID(8443)}}}},
		{name: "strict with strict ports only", mode: strict, inherited: permissive,
			ports: map[uint32]securityapi.PeerAuthentication_MutualTLS_Mode{8443: strict}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := BuildPeerAuthentication(peerAuth("shop", true, tt.mode, tt.ports), tt.inherited)
			if diff := cmp.Diff(tt.want, got.GetRules(), protocmp.Transform()); diff != "" {
				t.Errorf("BuildPeerAuthentication() rules mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
