package sidecar

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
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
			deny, allow := m.AuthorizationPolicies(tt.ns, tt.labels)
			if diff := cmp.Diff(tt.wantDeny, names(deny)); diff != "" {
				t.Errorf("deny (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantAllow, names(allow)); diff != "" {
				t.Errorf("allow (-want +got):\n%s", diff)
			}
		})
	}
}

func authn(m *matcherv3.StringMatcher) *rbacv3.Principal { return authenticated(m) }

func exact(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
}

func prefix(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: s}}
}

func suffix(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}}
}

func anyOnly() *rbacv3.Policy {
	return &rbacv3.Policy{Permissions: []*rbacv3.Permission{anyPermission()}, Principals: []*rbacv3.Principal{anyPrincipal()}}
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
		return &rbacv3.Policy{Permissions: []*rbacv3.Permission{anyPermission()}, Principals: []*rbacv3.Principal{p}}
	}
	withPermission := func(p *rbacv3.Permission) *rbacv3.Policy {
		return &rbacv3.Policy{Permissions: []*rbacv3.Permission{p}, Principals: []*rbacv3.Principal{anyPrincipal()}}
	}
	header := func(name string, m *matcherv3.StringMatcher) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: m}}
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
			want: withPrincipal(&rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: []*rbacv3.Principal{
				authn(exact("spiffe://td/ns/a/sa/b")),
				authn(prefix("spiffe://td/ns/a/")),
				authn(regexMatcher(`spiffe://.*/sa/b`)),
				authn(regexMatcher(`spiffe://.+`)),
			}}}}),
		},
		{
			name: "namespaces and not principals",
			rule: from(&securityapi.Source{Namespaces: []string{"prod-*"}, NotPrincipals: []string{"td/ns/prod-a/sa/bad"}}),
			want: withPrincipal(andPrincipals([]*rbacv3.Principal{
				{Identifier: &rbacv3.Principal_NotId{NotId: authn(exact("spiffe://td/ns/prod-a/sa/bad"))}},
				authn(regexMatcher(`.*/ns/prod-.*/.*`)),
			})),
		},
		{
			name: "service accounts, trust domains, ip blocks",
			rule: from(&securityapi.Source{ServiceAccounts: []string{"web"}, TrustDomains: []string{"td"}, IpBlocks: []string{"10.0.0.0/8"}, RemoteIpBlocks: []string{"192.0.2.1"}}),
			want: withPrincipal(andPrincipals([]*rbacv3.Principal{
				authn(regexMatcher(`spiffe://.+/ns/shop/(.+/|)sa/web(/.+)?`)),
				authn(prefix("spiffe://td/")),
				{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: &corev3.CidrRange{AddressPrefix: "192.0.2.1", PrefixLen: wrapperspb.UInt32(32)}}},
				{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: &corev3.CidrRange{AddressPrefix: "10.0.0.0", PrefixLen: wrapperspb.UInt32(8)}}},
			})),
		},
		{
			name: "request principals never match a proxyless server",
			rule: from(&securityapi.Source{RequestPrincipals: []string{"iss/sub"}}),
			want: withPrincipal(neverPrincipal()),
		},
		{
			name: "operation: hosts, methods, paths, ports",
			rule: to(&securityapi.Operation{Hosts: []string{"*.example.com"}, Methods: []string{"POST"}, Paths: []string{"/pkg.Svc/Get"}, NotPorts: []string{"8080"}}),
			want: withPermission(andPermissions([]*rbacv3.Permission{
				{Rule: &rbacv3.Permission_Header{Header: header(":authority", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: ".example.com"}, IgnoreCase: true})}},
				{Rule: &rbacv3.Permission_Header{Header: header(":method", exact("POST"))}},
				{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: exact("/pkg.Svc/Get")}}}},
				{Rule: &rbacv3.Permission_NotRule{NotRule: &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 8080}}}},
			})),
		},
		{
			name: "two operations are alternatives",
			rule: &securityapi.Rule{To: []*securityapi.Rule_To{
				{Operation: &securityapi.Operation{Paths: []string{"*/Get"}}},
				{Operation: &securityapi.Operation{Ports: []string{"9000"}}},
			}},
			want: &rbacv3.Policy{
				Permissions: []*rbacv3.Permission{
					{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: suffix("/Get")}}}},
					{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 9000}},
				},
				Principals: []*rbacv3.Principal{anyPrincipal()},
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
				Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 9000}}},
				Principals: []*rbacv3.Principal{andPrincipals([]*rbacv3.Principal{
					authn(regexMatcher(`.*/ns/a/.*`)),
					{Identifier: &rbacv3.Principal_NotId{NotId: &rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: &routev3.HeaderMatcher{
						Name: "x-user", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
					}}}}},
				})},
			},
		},
		{
			name: "ALLOW: a path template matches nothing",
			rule: to(&securityapi.Operation{Paths: []string{"/pkg.Svc/{*}"}}),
			want: neverPolicy(),
		},
		{
			name:   "DENY: a path template is dropped",
			action: rbacv3.RBAC_DENY,
			rule:   to(&securityapi.Operation{Paths: []string{"/pkg.Svc/{*}"}}),
			want:   anyOnly(),
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
			want: withPrincipal(authn(exact("spiffe://td/ns/a/sa/b"))),
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
