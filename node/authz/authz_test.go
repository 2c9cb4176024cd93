package authz

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func exact(s string) *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: s}}
}
func prefix(s string) *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Prefix{Prefix: s}}
}
func suffix(s string) *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Suffix{Suffix: s}}
}
func presence() *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}
}
func cidr(s string) *security.Address {
	p := netip.MustParsePrefix(s)
	return &security.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}
}

// policy builds a policy with one rule of one clause of the matches.
func policy(name string, action security.Action, matches ...*security.Match) *security.Authorization {
	return &security.Authorization{Name: name, Namespace: "apps", Scope: security.Scope_NAMESPACE, Action: action,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: matches}}}}}
}

func allow(name string, m ...*security.Match) *security.Authorization {
	return policy(name, security.Action_ALLOW, m...)
}
func deny(name string, m ...*security.Match) *security.Authorization {
	return policy(name, security.Action_DENY, m...)
}

var (
	client = &workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "client"}
	other  = &workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "other", ServiceAccount: "default"}
	src    = netip.MustParseAddr("10.244.1.5")
	dst    = netip.MustParseAddr("10.244.2.7")
)

func conn(peer *workloadapi.Identity, port uint16) Conn {
	return Conn{Src: src, Dst: dst, DstPort: port, Peer: peer}
}

func TestEvaluate(t *testing.T) {
	t.Parallel()
	strict := &security.Authorization{Name: "istio_converted_static_strict", Namespace: "istio-system", Scope: security.Scope_GLOBAL,
		Action: security.Action_DENY, Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{NotPrincipals: []*security.StringMatch{presence()}}}}}}}}
	twoClauses := &security.Authorization{Name: "ns-and-port", Namespace: "apps", Action: security.Action_ALLOW, Rules: []*security.Rule{{Clauses: []*security.Clause{
		{Matches: []*security.Match{{Namespaces: []*security.StringMatch{exact("apps")}}}},
		{Matches: []*security.Match{{DestinationPorts: []uint32{8080}}}},
	}}}}
	twoRules := &security.Authorization{Name: "either", Namespace: "apps", Action: security.Action_ALLOW, Rules: []*security.Rule{
		{Clauses: []*security.Clause{{Matches: []*security.Match{{DestinationPorts: []uint32{9000}}}}}},
		{Clauses: []*security.Clause{{Matches: []*security.Match{{Namespaces: []*security.StringMatch{exact("other")}}}}}},
	}}
	noRules := &security.Authorization{Name: "no-rules", Namespace: "apps", Action: security.Action_ALLOW}
	noRulesDeny := &security.Authorization{Name: "no-rules-deny", Namespace: "apps", Action: security.Action_DENY}
	emptyClause := &security.Authorization{Name: "empty-clause", Namespace: "apps", Action: security.Action_ALLOW,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{}}}}}
	onlyEmptyMatches := allow("only-empty-matches", &security.Match{}, &security.Match{})
	dryDeny := deny("dry-deny", &security.Match{Namespaces: []*security.StringMatch{exact("apps")}})
	dryDeny.DryRun = true
	dryAllow := allow("dry-allow", &security.Match{Namespaces: []*security.StringMatch{exact("nope")}})
	dryAllow.DryRun = true

	for _, tt := range []struct {
		name     string
		policies []*security.Authorization
		conn     Conn
		want     Decision
	}{
		{"no policies: allow", nil, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"plaintext, no policies: allow", nil, conn(nil, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"allow by exact namespace", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{exact("apps")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"allow does not match other namespace", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{exact("apps")}})}, conn(other, 80), Decision{Reason: "no allow policy matched"}},
		{"namespace prefix", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{prefix("ap")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"namespace suffix", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{suffix("her")}})}, conn(other, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"principal exact without spiffe://", []*security.Authorization{allow("a", &security.Match{Principals: []*security.StringMatch{exact("cluster.local/ns/apps/sa/client")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"principal with spiffe:// never matches", []*security.Authorization{allow("a", &security.Match{Principals: []*security.StringMatch{exact("spiffe://cluster.local/ns/apps/sa/client")}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"principal suffix", []*security.Authorization{allow("a", &security.Match{Principals: []*security.StringMatch{suffix("/sa/client")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"principal presence with identity", []*security.Authorization{allow("a", &security.Match{Principals: []*security.StringMatch{presence()}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"principal presence, plaintext", []*security.Authorization{allow("a", &security.Match{Principals: []*security.StringMatch{presence()}})}, conn(nil, 80), Decision{Reason: "no allow policy matched"}},
		{"STRICT denies plaintext", []*security.Authorization{strict}, conn(nil, 80), Decision{Policy: "istio-system/istio_converted_static_strict", Reason: "denied by"}},
		{"STRICT allows mTLS", []*security.Authorization{strict}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"deny by port", []*security.Authorization{deny("d", &security.Match{DestinationPorts: []uint32{80}})}, conn(client, 80), Decision{Policy: "apps/d", Reason: "denied by"}},
		{"deny on another port lets through", []*security.Authorization{deny("d", &security.Match{DestinationPorts: []uint32{81}})}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"deny wins over a matching allow", []*security.Authorization{allow("a", &security.Match{DestinationPorts: []uint32{80}}), deny("d", &security.Match{Namespaces: []*security.StringMatch{exact("apps")}})}, conn(client, 80), Decision{Policy: "apps/d", Reason: "denied by"}},
		{"not_ports excludes", []*security.Authorization{allow("a", &security.Match{NotDestinationPorts: []uint32{80}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"not_ports allows others", []*security.Authorization{allow("a", &security.Match{NotDestinationPorts: []uint32{80}})}, conn(client, 81), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"source CIDR", []*security.Authorization{allow("a", &security.Match{SourceIps: []*security.Address{cidr("10.244.1.0/24")}})}, conn(nil, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"source CIDR miss", []*security.Authorization{allow("a", &security.Match{SourceIps: []*security.Address{cidr("10.244.9.0/24")}})}, conn(nil, 80), Decision{Reason: "no allow policy matched"}},
		{"not source IP", []*security.Authorization{deny("d", &security.Match{NotSourceIps: []*security.Address{cidr("10.244.1.5/32")}})}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"destination IP", []*security.Authorization{allow("a", &security.Match{DestinationIps: []*security.Address{cidr("10.244.2.7/32")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"not destination IP", []*security.Authorization{allow("a", &security.Match{NotDestinationIps: []*security.Address{cidr("10.244.2.0/24")}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"malformed address matches nothing", []*security.Authorization{allow("a", &security.Match{SourceIps: []*security.Address{{Address: []byte{1, 2, 3}, Length: 8}}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"service account", []*security.Authorization{allow("a", &security.Match{ServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "apps", ServiceAccount: "client"}}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"service account of another namespace", []*security.Authorization{allow("a", &security.Match{ServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "other", ServiceAccount: "client"}}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"not service account, plaintext", []*security.Authorization{allow("a", &security.Match{NotServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "apps", ServiceAccount: "client"}}})}, conn(nil, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"not namespaces, plaintext matches none", []*security.Authorization{deny("d", &security.Match{NotNamespaces: []*security.StringMatch{exact("apps")}})}, conn(nil, 80), Decision{Policy: "apps/d", Reason: "denied by"}},
		{"attributes of one match are AND-ed", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{exact("apps")}, DestinationPorts: []uint32{9000}})}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"values of one attribute are OR-ed", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{exact("x"), exact("apps")}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"matches of a clause are OR-ed", []*security.Authorization{allow("a", &security.Match{Namespaces: []*security.StringMatch{exact("x")}}, &security.Match{DestinationPorts: []uint32{80}})}, conn(client, 80), Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
		{"clauses are AND-ed: both hold", []*security.Authorization{twoClauses}, conn(client, 8080), Decision{Allow: true, Policy: "apps/ns-and-port", Reason: "allowed by"}},
		{"clauses are AND-ed: one fails", []*security.Authorization{twoClauses}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"rules are OR-ed", []*security.Authorization{twoRules}, conn(other, 80), Decision{Allow: true, Policy: "apps/either", Reason: "allowed by"}},
		{"a policy without rules never matches (allow)", []*security.Authorization{noRules}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"a policy without rules never matches (deny)", []*security.Authorization{noRulesDeny}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"an empty clause matches", []*security.Authorization{emptyClause}, conn(nil, 80), Decision{Allow: true, Policy: "apps/empty-clause", Reason: "allowed by"}},
		{"a clause of empty matches does not", []*security.Authorization{onlyEmptyMatches}, conn(client, 80), Decision{Reason: "no allow policy matched"}},
		{"dry-run deny is only reported", []*security.Authorization{dryDeny}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy", DryRun: []string{"apps/dry-deny"}}},
		{"dry-run allow does not make allow policies enforced", []*security.Authorization{dryAllow}, conn(client, 80), Decision{Allow: true, Reason: "no allow policy"}},
		{"IPv4-mapped source matches a v4 CIDR", []*security.Authorization{allow("a", &security.Match{SourceIps: []*security.Address{cidr("10.244.1.0/24")}})}, Conn{Src: netip.MustParseAddr("::ffff:10.244.1.5"), Dst: dst, DstPort: 80}, Decision{Allow: true, Policy: "apps/a", Reason: "allowed by"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, Evaluate(tt.policies, tt.conn)); diff != "" {
				t.Errorf("Evaluate() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplicable(t *testing.T) {
	t.Parallel()
	global := &security.Authorization{Name: "g", Namespace: "istio-system", Scope: security.Scope_GLOBAL}
	ns := &security.Authorization{Name: "n", Namespace: "apps", Scope: security.Scope_NAMESPACE}
	otherNS := &security.Authorization{Name: "n", Namespace: "other", Scope: security.Scope_NAMESPACE}
	selected := &security.Authorization{Name: "s", Namespace: "apps", Scope: security.Scope_WORKLOAD_SELECTOR}
	unselected := &security.Authorization{Name: "u", Namespace: "apps", Scope: security.Scope_WORKLOAD_SELECTOR}
	w := &workloadapi.Workload{Namespace: "apps", AuthorizationPolicies: []string{"apps/s"}}
	got := Applicable([]*security.Authorization{global, ns, otherNS, selected, unselected}, w)
	var names []string
	for _, p := range got {
		names = append(names, security.ResourceName(p))
	}
	if diff := cmp.Diff([]string{"istio-system/g", "apps/n", "apps/s"}, names); diff != "" {
		t.Errorf("Applicable() mismatch (-want +got):\n%s", diff)
	}
}
