package sidecar

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
)

func TestAuthorizationPoliciesSelection(t *testing.T) {
	t.Parallel()
	m := testMesh()
	names := func(aps []*securityv1.AuthorizationPolicy) []string {
		var out []string
		for _, ap := range aps {
			out = append(out, ap.Namespace+"/"+ap.Name)
		}
		return out
	}
	for _, tt := range []struct {
		name                string
		ns                  string
		labels              map[string]string
		wantDeny, wantAllow []string
	}{
		{
			name: "reviews v1", ns: "default", labels: map[string]string{"app": "reviews", "version": "v1"},
			wantDeny: []string{"istio-system/deny-untrusted"}, wantAllow: []string{"default/allow-nothing", "default/reviews-readers"},
		},
		{
			name: "reviews v2", ns: "default", labels: map[string]string{"app": "reviews", "version": "v2"},
			wantDeny: []string{"istio-system/deny-untrusted"}, wantAllow: []string{"default/reviews-readers"},
		},
		{
			name: "ratings", ns: "default", labels: map[string]string{"app": "ratings"},
			wantDeny: []string{"default/ratings-only", "istio-system/deny-untrusted"},
		},
		{name: "other namespace", ns: "other", wantDeny: []string{"istio-system/deny-untrusted", "other/deny-all"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ps := m.AuthorizationPolicies(tt.ns, tt.labels)
			if diff := cmp.Diff(tt.wantDeny, names(ps.Deny)); diff != "" {
				t.Errorf("deny (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantAllow, names(ps.Allow)); diff != "" {
				t.Errorf("allow (-want +got):\n%s", diff)
			}
		})
	}
}

func authn(m *matcherv3.StringMatcher) *rbacv3.Principal { return authenticated(m) }

func exact(s string) *matcherv3.StringMatcher  { return exactMatcher(s) }
func prefix(s string) *matcherv3.StringMatcher { return prefixMatcher(s) }
func suffix(s string) *matcherv3.StringMatcher { return suffixMatcher(s) }

func andPerm(ps ...*rbacv3.Permission) *rbacv3.Permission { return andPermissions(ps) }
func orPerm(ps ...*rbacv3.Permission) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: ps}}}
}
func andPrinc(ps ...*rbacv3.Principal) *rbacv3.Principal { return andPrincipals(ps) }
func orPrinc(ps ...*rbacv3.Principal) *rbacv3.Principal  { return orPrincipals(ps) }

// anyOnly is a rule without conditions, as istiod shapes it.
func anyOnly() *rbacv3.Policy {
	return &rbacv3.Policy{Permissions: []*rbacv3.Permission{andPerm()}, Principals: []*rbacv3.Principal{andPrinc()}}
}

func jwtString(claim string, m *matcherv3.StringMatcher) *rbacv3.Principal {
	return metadataPrincipal(&matcherv3.MetadataMatcher{
		Filter: "envoy.filters.http.jwt_authn",
		Path: []*matcherv3.MetadataMatcher_PathSegment{
			{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: "payload"}},
			{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: claim}},
		},
		Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: m}},
	})
}

func TestRBACPolicy(t *testing.T) {
	t.Parallel()
	from := func(s *securityapi.Source) *securityapi.Rule {
		return &securityapi.Rule{From: []*securityapi.Rule_From{{Source: s}}}
	}
	to := func(o *securityapi.Operation) *securityapi.Rule {
		return &securityapi.Rule{To: []*securityapi.Rule_To{{Operation: o}}}
	}
	withPrincipal := func(p *rbacv3.Principal) *rbacv3.Policy {
		return &rbacv3.Policy{Permissions: []*rbacv3.Permission{andPerm()}, Principals: []*rbacv3.Principal{p}}
	}
	withPermission := func(p *rbacv3.Permission) *rbacv3.Policy {
		return &rbacv3.Policy{Permissions: []*rbacv3.Permission{p}, Principals: []*rbacv3.Principal{andPrinc()}}
	}
	header := func(name string, m *matcherv3.StringMatcher) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: m}}
	}
	ip := func(a string, bits uint32) *corev3.CidrRange {
		return &corev3.CidrRange{AddressPrefix: a, PrefixLen: wrapperspb.UInt32(bits)}
	}
	for _, tt := range []struct {
		name   string
		action rbacv3.RBAC_Action
		rule   *securityapi.Rule
		want   *rbacv3.Policy
	}{
		{name: "empty rule matches everything", rule: &securityapi.Rule{}, want: anyOnly()},
		{
			name: "principals: exact, prefix, suffix, any",
			rule: from(&securityapi.Source{Principals: []string{"td/ns/a/sa/b", "td/ns/a/*", "*/sa/b", "*"}}),
			want: withPrincipal(andPrinc(orPrinc(
				authn(exact("spiffe://td/ns/a/sa/b")),
				authn(prefix("spiffe://td/ns/a/")),
				authn(regexMatcher(`spiffe://.*/sa/b`)),
				authn(regexMatcher(`.+`)),
			))),
		},
		{
			name: "namespaces and not principals",
			rule: from(&securityapi.Source{Namespaces: []string{"prod-*"}, NotPrincipals: []string{"td/ns/prod-a/sa/bad"}}),
			want: withPrincipal(andPrinc(
				notPrincipal(orPrinc(authn(exact("spiffe://td/ns/prod-a/sa/bad")))),
				orPrinc(authn(regexMatcher(`.*/ns/prod-.*/.*`))),
			)),
		},
		{
			name: "service accounts, trust domains, ip blocks",
			rule: from(&securityapi.Source{
				ServiceAccounts: []string{"web"}, TrustDomains: []string{"td", "*.corp", "a*b*"},
				IpBlocks: []string{"10.0.0.0/8"}, NotIpBlocks: []string{"10.0.0.7"}, RemoteIpBlocks: []string{"192.0.2.1"},
			}),
			want: withPrincipal(andPrinc(
				orPrinc(authn(regexMatcher(`spiffe://.+/ns/shop/(.+/|)sa/web(/.+)?`))),
				orPrinc(
					authn(prefix("spiffe://td/")),
					authn(regexMatcher(`spiffe://[^/]*\.corp/.*`)),
					authn(regexMatcher(`spiffe://a[^/]*b\*/.*`)),
				),
				orPrinc(&rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: ip("192.0.2.1", 32)}}),
				orPrinc(&rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: ip("10.0.0.0", 8)}}),
				notPrincipal(orPrinc(&rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: ip("10.0.0.7", 32)}})),
			)),
		},
		{
			name: "request principals are JWT metadata, which grpc-go never matches",
			rule: from(&securityapi.Source{RequestPrincipals: []string{"https://iss/sub"}, NotRequestPrincipals: []string{"*", "iss/*", "*-dev"}}),
			want: withPrincipal(andPrinc(
				andPrinc(jwtString("iss", exact("https://iss")), jwtString("sub", exact("sub"))),
				notPrincipal(orPrinc(
					andPrinc(jwtString("iss", regexMatcher(".+")), jwtString("sub", regexMatcher(".+"))),
					andPrinc(jwtString("iss", exact("iss")), jwtString("sub", regexMatcher(".+"))),
					andPrinc(jwtString("iss", regexMatcher(".+")), jwtString("sub", suffix("-dev"))),
				)),
			)),
		},
		{
			name: "operation: hosts, methods, paths, ports",
			rule: to(&securityapi.Operation{Hosts: []string{"*.example.com"}, Methods: []string{"POST"}, Paths: []string{"/pkg.Svc/Get"}, NotPorts: []string{"8080"}}),
			want: withPermission(andPerm(
				orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: header(":authority", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: ".example.com"}, IgnoreCase: true})}}),
				orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: header(":method", exact("POST"))}}),
				orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: exact("/pkg.Svc/Get")}}}}),
				notPermission(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 8080}})),
			)),
		},
		{
			name: "two operations are alternatives",
			rule: &securityapi.Rule{To: []*securityapi.Rule_To{
				{Operation: &securityapi.Operation{Paths: []string{"*/Get"}}},
				{Operation: &securityapi.Operation{Ports: []string{"9000"}}},
			}},
			want: &rbacv3.Policy{
				Permissions: []*rbacv3.Permission{
					andPerm(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: suffix("/Get")}}}})),
					andPerm(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 9000}})),
				},
				Principals: []*rbacv3.Principal{andPrinc()},
			},
		},
		{
			name: "when conditions join every operation and source",
			rule: &securityapi.Rule{
				From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"a"}}}},
				When: []*securityapi.Condition{
					{Key: "destination.port", Values: []string{"9000"}},
					{Key: "request.headers[x-user]", NotValues: []string{"*"}},
				},
			},
			want: &rbacv3.Policy{
				Permissions: []*rbacv3.Permission{andPerm(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 9000}}))},
				Principals: []*rbacv3.Principal{andPrinc(
					orPrinc(authn(regexMatcher(`.*/ns/a/.*`))),
					notPrincipal(orPrinc(&rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: &routev3.HeaderMatcher{
						Name: "x-user", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
					}}})),
				)},
			},
		},
		{
			name: "when: JWT claims, one value or several, as a list or a string",
			rule: &securityapi.Rule{When: []*securityapi.Condition{
				{Key: "request.auth.claims[groups][0]", Values: []string{"admin"}},
				{Key: "request.auth.audiences", NotValues: []string{"a", "b*"}},
			}},
			want: withPrincipal(andPrinc(
				metadataPrincipal(jwtMetadata([]string{"groups", "0"}, orValue(listOneOf(stringValue(exact("admin"))), stringValue(exact("admin"))))),
				notPrincipal(metadataPrincipal(jwtMetadata([]string{"aud"}, orValue(
					listOneOf(orValue(stringValue(exact("a")), stringValue(prefix("b")))),
					orValue(stringValue(exact("a")), stringValue(prefix("b"))),
				)))),
			)),
		},
		{
			name: "ALLOW: a path template matches nothing",
			rule: to(&securityapi.Operation{Paths: []string{"/pkg.Svc/{*}"}}),
			want: neverPolicy(),
		},
		{
			name:   "DENY: a path template drops the paths",
			action: rbacv3.RBAC_DENY,
			rule:   to(&securityapi.Operation{Paths: []string{"/pkg.Svc/{*}"}, Ports: []string{"7070"}}),
			want:   withPermission(andPerm(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 7070}}))),
		},
		{
			name: "ALLOW: a grpc- header matches nothing",
			rule: &securityapi.Rule{When: []*securityapi.Condition{{Key: "request.headers[grpc-timeout]", Values: []string{"1s"}}}},
			want: neverPolicy(),
		},
		{
			name:   "DENY: an unknown key is dropped",
			action: rbacv3.RBAC_DENY,
			rule: &securityapi.Rule{
				From: []*securityapi.Rule_From{{Source: &securityapi.Source{Principals: []string{"td/ns/a/sa/b"}}}},
				When: []*securityapi.Condition{{Key: "experimental.envoy.filters.x[y]", Values: []string{"z"}}},
			},
			want: withPrincipal(andPrinc(orPrinc(authn(exact("spiffe://td/ns/a/sa/b"))))),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := rbacPolicy(tt.action, "shop", tt.rule)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("rbacPolicy() mismatch (-want +got):\n%s", diff)
			}
			if err := got.ValidateAll(); err != nil {
				t.Errorf("invalid policy: %v", err)
			}
		})
	}
}

func orValue(vs ...*matcherv3.ValueMatcher) *matcherv3.ValueMatcher {
	return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: vs}}}
}

func listOneOf(v *matcherv3.ValueMatcher) *matcherv3.ValueMatcher {
	return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: v}}}}
}

func TestClaimPath(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "[iss]", want: []string{"iss"}},
		{in: "[a][b]", want: []string{"a", "b"}},
		{in: "[a.b]", want: []string{"a.b"}},
		{in: "[a[b]]", want: []string{"a[b]"}},
		{in: "[a]x", wantErr: true},
		{in: "a", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := claimPath(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("claimPath(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("claimPath(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestRBACRulesWithoutRules(t *testing.T) {
	t.Parallel()
	ap := &securityv1.AuthorizationPolicy{}
	ap.Namespace, ap.Name = "shop", "none"
	if got := rbacRules(rbacv3.RBAC_DENY, []*securityv1.AuthorizationPolicy{ap}, rbacPolicyName); len(got.Policies) != 0 {
		t.Errorf("DENY policy without rules: got policies %v, want none (it denies nothing)", got.Policies)
	}
	got := rbacRules(rbacv3.RBAC_ALLOW, []*securityv1.AuthorizationPolicy{ap}, rbacPolicyName)
	if diff := cmp.Diff(map[string]*rbacv3.Policy{"shop-none-0": neverPolicy()}, got.Policies, protocmp.Transform()); diff != "" {
		t.Errorf("ALLOW policy without rules (-want +got):\n%s", diff)
	}
}

// TestCustomPoliciesFailClosed, written as the attack: reviews v1 protects
// /admin* with a CUSTOM policy (testAuthorizationPolicies). Every chain
// of its sidecar's inbound listener and its proxyless server listener
// must deny what the policy names: over HTTP the policy's rule, over TCP
// (where a path cannot be seen) every connection, as istiod does for a
// CUSTOM policy whose provider it cannot use. Before, the policy was
// dropped and GET /admin/users passed.
func TestCustomPoliciesFailClosed(t *testing.T) {
	t.Parallel()
	m := testMesh()
	const envoyKey = "istio-ext-authz-ext-authz-ns[default]-policy[custom]-rule[0]-deny-due-to-bad-CUSTOM-action"
	adminOnly := &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{andPerm(orPerm(&rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{
			Rule: &matcherv3.PathMatcher_Path{Path: prefix("/admin")},
		}}}))},
		Principals: []*rbacv3.Principal{andPrinc()},
	}

	var inbound *listenerv3.Listener
	for _, n := range m.SidecarListeners(sidecarProxy) {
		if n.Name == VirtualInbound {
			inbound = n.Resource.(*listenerv3.Listener)
		}
	}
	if len(inbound.GetFilterChains()) == 0 {
		t.Fatal("no inbound filter chains")
	}
	for _, fc := range inbound.GetFilterChains() {
		if fc.GetName() == "virtualInbound-blackhole" {
			continue // takes nothing anywhere
		}
		first, http := firstRBAC(t, fc)
		if first == nil {
			t.Errorf("chain %s: no RBAC filter", fc.GetName())
			continue
		}
		want := anyOnly()
		if http {
			want = adminOnly
		}
		if first.GetAction() != rbacv3.RBAC_DENY {
			t.Errorf("chain %s: first RBAC filter is %s, want DENY", fc.GetName(), first.GetAction())
		}
		if diff := cmp.Diff(map[string]*rbacv3.Policy{envoyKey: want}, first.GetPolicies(), protocmp.Transform()); diff != "" {
			t.Errorf("chain %s (http %v): CUSTOM rules (-want +got):\n%s", fc.GetName(), http, diff)
		}
	}

	server := Proxy{Namespace: "default", Labels: sidecarProxy.Labels, IPs: sidecarProxy.IPs}
	var deny *rbacv3.RBAC
	for _, n := range m.GRPCListeners(server, []string{ServerListenerPrefix + "0.0.0.0:10080"}) {
		for _, fc := range n.Resource.(*listenerv3.Listener).GetFilterChains() {
			for _, f := range httpFilters(t, fc) {
				if f.GetName() == RBACDenyFilter {
					deny = unmarshalRBAC(t, f.GetTypedConfig()).GetRules()
				}
			}
		}
	}
	if got := deny.GetPolicies()["default-custom-0"+securitypolicy.CustomDeniedSuffix]; got == nil {
		t.Errorf("proxyless server: no DENY rule for the CUSTOM policy in %v", deny)
	}
}

// firstRBAC is the first RBAC of a chain: a network filter's, else the
// HTTP connection manager's first, and whether it is the HTTP one.
func firstRBAC(t *testing.T, fc *listenerv3.FilterChain) (*rbacv3.RBAC, bool) {
	t.Helper()
	for _, f := range fc.GetFilters() {
		if f.GetName() == "envoy.filters.network.rbac" {
			var r rbacnetv3.RBAC
			if err := f.GetTypedConfig().UnmarshalTo(&r); err != nil {
				t.Fatal(err)
			}
			return r.GetRules(), false
		}
	}
	for _, f := range httpFilters(t, fc) {
		if f.GetName() == "envoy.filters.http.rbac" {
			return unmarshalRBAC(t, f.GetTypedConfig()).GetRules(), true
		}
	}
	return nil, false
}

func httpFilters(t *testing.T, fc *listenerv3.FilterChain) []*hcmv3.HttpFilter {
	t.Helper()
	for _, f := range fc.GetFilters() {
		var hcm hcmv3.HttpConnectionManager
		if f.GetTypedConfig().MessageIs(&hcm) {
			if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
				t.Fatal(err)
			}
			return hcm.GetHttpFilters()
		}
	}
	return nil
}

func unmarshalRBAC(t *testing.T, a *anypb.Any) *rbacfilterv3.RBAC {
	t.Helper()
	var r rbacfilterv3.RBAC
	if err := a.UnmarshalTo(&r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestDryRunAsIstiodReadsIt, written as the attack: an allow-all trial
// marked istio.io/dry-run "True" (or "1", "t") was enforced, opening the
// workload, where istiod only logs it. A value that does not parse is
// enforced, as in istiod.
func TestDryRunAsIstiodReadsIt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		value    string
		enforced bool
	}{
		{"true", false}, {"True", false}, {"TRUE", false}, {"1", false}, {"t", false},
		{"false", true}, {"0", true}, {"", true}, {"yes", true},
	} {
		ap := &securityv1.AuthorizationPolicy{ObjectMeta: meta("shop", "trial", time.Hour)}
		ap.Annotations = map[string]string{securitypolicy.AnnotationDryRun: tt.value}
		ap.Spec.Rules = []*securityapi.Rule{{}}
		m := NewMesh(Inputs{AuthorizationPolicies: []*securityv1.AuthorizationPolicy{ap}})
		if got := len(m.AuthorizationPolicies("shop", nil).Allow) == 1; got != tt.enforced {
			t.Errorf("dry-run %q: enforced %v, want %v", tt.value, got, tt.enforced)
		}
	}
}
