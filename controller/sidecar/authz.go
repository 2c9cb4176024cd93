package sidecar

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
)

// RBAC filter names on a proxyless server's chain: the DENY filter runs
// first, then the ALLOW filter (Istio's order; gRPC supports only these two
// actions).
const (
	RBACDenyFilter  = "envoy.filters.http.rbac.DENY"
	RBACAllowFilter = "envoy.filters.http.rbac"
)

// dryRunAnnotation marks a policy Istio only evaluates and logs.
const dryRunAnnotation = "istio.io/dry-run"

// errUnsupported: a condition gRPC's RBAC engine cannot evaluate, or would
// reject.
var errUnsupported = errors.New("not supported by gRPC")

// AuthorizationPolicies returns the ALLOW and DENY policies that apply to
// a workload of namespace ns with labels lbls, oldest first: those of the
// root namespace and of ns without a selector or whose selector's labels
// the workload has. Policies with targetRefs (gateways and waypoints only),
// CUSTOM and AUDIT policies (gRPC cannot enforce them), and dry-run
// policies (gRPC has no shadow rules) are left out.
func (m *Mesh) AuthorizationPolicies(ns string, lbls map[string]string) (deny, allow []*securityv1.AuthorizationPolicy) {
	for _, ap := range m.authorizationPolicies {
		if ap.Namespace != ns && ap.Namespace != m.RootNamespace {
			continue
		}
		if len(ap.Spec.GetTargetRefs()) > 0 || ap.Spec.GetTargetRef() != nil || ap.Annotations[dryRunAnnotation] == "true" {
			continue
		}
		if !selects(ap.Spec.GetSelector().GetMatchLabels(), lbls) {
			continue
		}
		switch ap.Spec.GetAction() {
		case securityapi.AuthorizationPolicy_DENY:
			deny = append(deny, ap)
		case securityapi.AuthorizationPolicy_ALLOW:
			allow = append(allow, ap)
		}
	}
	return deny, allow
}

// grpcRBACFilters are the RBAC filters for a proxyless server: a DENY
// filter when a DENY policy applies, then an ALLOW filter when an ALLOW
// policy applies. Each rule i of policy ns/name is the RBAC policy
// "<ns>-<name>-<i>"; a policy without rules is one that never matches, so
// an ALLOW policy without rules allows nothing.
func (m *Mesh) grpcRBACFilters(p Proxy) []*hcmv3.HttpFilter {
	deny, allow := m.AuthorizationPolicies(p.Namespace, p.Labels)
	var out []*hcmv3.HttpFilter
	if len(deny) > 0 {
		out = append(out, rbacFilter(RBACDenyFilter, rbacRules(rbacv3.RBAC_DENY, deny)))
	}
	if len(allow) > 0 {
		out = append(out, rbacFilter(RBACAllowFilter, rbacRules(rbacv3.RBAC_ALLOW, allow)))
	}
	return out
}

func rbacFilter(name string, rules *rbacv3.RBAC) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbacfilterv3.RBAC{Rules: rules})}}
}

func rbacRules(action rbacv3.RBAC_Action, policies []*securityv1.AuthorizationPolicy) *rbacv3.RBAC {
	out := &rbacv3.RBAC{Action: action, Policies: map[string]*rbacv3.Policy{}}
	for _, ap := range policies {
		rules := ap.Spec.GetRules()
		if len(rules) == 0 {
			out.Policies[rbacPolicyName(ap, 0)] = neverPolicy()
		}
		for i, r := range rules {
			out.Policies[rbacPolicyName(ap, i)] = rbacPolicy(action, ap.Namespace, r)
		}
	}
	return out
}

// rbacPolicyName is istiod's key for a rule on a proxyless server.
func rbacPolicyName(ap *securityv1.AuthorizationPolicy, i int) string {
	return ap.Namespace + "-" + ap.Name + "-" + strconv.Itoa(i)
}

func neverPolicy() *rbacv3.Policy {
	return &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_NotRule{NotRule: anyPermission()}}},
		Principals:  []*rbacv3.Principal{neverPrincipal()},
	}
}

func anyPermission() *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}}
}
func anyPrincipal() *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}}
}
func neverPrincipal() *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: anyPrincipal()}}
}

// rbacPolicy translates one rule: it matches when one of its "to"
// operations and one of its "from" sources match, each with all "when"
// conditions. A condition gRPC cannot evaluate makes an ALLOW rule match
// nothing (allowing less) and is dropped from a DENY rule (denying more),
// as Istio treats conditions a proxy cannot enforce.
func rbacPolicy(action rbacv3.RBAC_Action, ns string, r *securityapi.Rule) *rbacv3.Policy {
	var whenPerms []*rbacv3.Permission
	var whenPrincs []*rbacv3.Principal
	for _, c := range r.GetWhen() {
		perm, princ, err := whenCondition(ns, c)
		switch {
		case err != nil && action == rbacv3.RBAC_ALLOW:
			return neverPolicy()
		case err != nil:
			continue
		}
		whenPerms = append(whenPerms, perm...)
		whenPrincs = append(whenPrincs, princ...)
	}

	var perms []*rbacv3.Permission
	tos := r.GetTo()
	if len(tos) == 0 {
		tos = []*securityapi.Rule_To{{}}
	}
	for _, to := range tos {
		and, err := operation(action, to.GetOperation())
		if err != nil {
			return neverPolicy()
		}
		perms = append(perms, andPermissions(append(and, whenPerms...)))
	}

	var princs []*rbacv3.Principal
	froms := r.GetFrom()
	if len(froms) == 0 {
		froms = []*securityapi.Rule_From{{}}
	}
	for _, from := range froms {
		and, err := source(action, ns, from.GetSource())
		if err != nil {
			return neverPolicy()
		}
		princs = append(princs, andPrincipals(append(and, whenPrincs...)))
	}
	return &rbacv3.Policy{Permissions: perms, Principals: princs}
}

// operation is the permissions an operation requires: one of its hosts,
// methods, paths and ports each, and none of the excluded ones.
func operation(action rbacv3.RBAC_Action, o *securityapi.Operation) ([]*rbacv3.Permission, error) {
	var out []*rbacv3.Permission
	for _, f := range []struct {
		values, not []string
		one         func(string) (*rbacv3.Permission, error)
	}{
		{o.GetHosts(), o.GetNotHosts(), hostPermission},
		{o.GetMethods(), o.GetNotMethods(), methodPermission},
		{o.GetPaths(), o.GetNotPaths(), pathPermission},
		{o.GetPorts(), o.GetNotPorts(), portPermission},
	} {
		perm, err := permissionCondition(f.values, f.not, f.one)
		if err != nil {
			if action == rbacv3.RBAC_ALLOW {
				return nil, err
			}
			continue
		}
		out = append(out, perm...)
	}
	return out, nil
}

// source is the principals a source requires.
func source(action rbacv3.RBAC_Action, ns string, s *securityapi.Source) ([]*rbacv3.Principal, error) {
	var out []*rbacv3.Principal
	for _, f := range []struct {
		values, not []string
		one         func(string) (*rbacv3.Principal, error)
	}{
		{s.GetPrincipals(), s.GetNotPrincipals(), principalPrincipal},
		{s.GetRequestPrincipals(), s.GetNotRequestPrincipals(), requestAuthPrincipal},
		{s.GetServiceAccounts(), s.GetNotServiceAccounts(), func(v string) (*rbacv3.Principal, error) { return serviceAccountPrincipal(ns, v) }},
		{s.GetTrustDomains(), s.GetNotTrustDomains(), trustDomainPrincipal},
		{s.GetNamespaces(), s.GetNotNamespaces(), namespacePrincipal},
		{s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), remoteIPPrincipal},
		{s.GetIpBlocks(), s.GetNotIpBlocks(), directIPPrincipal},
	} {
		princ, err := principalCondition(f.values, f.not, f.one)
		if err != nil {
			if action == rbacv3.RBAC_ALLOW {
				return nil, err
			}
			continue
		}
		out = append(out, princ...)
	}
	return out, nil
}

// whenCondition is a "when" condition as permissions or principals.
func whenCondition(ns string, c *securityapi.Condition) ([]*rbacv3.Permission, []*rbacv3.Principal, error) {
	k, vs, nvs := c.GetKey(), c.GetValues(), c.GetNotValues()
	perm := func(one func(string) (*rbacv3.Permission, error)) ([]*rbacv3.Permission, []*rbacv3.Principal, error) {
		p, err := permissionCondition(vs, nvs, one)
		return p, nil, err
	}
	princ := func(one func(string) (*rbacv3.Principal, error)) ([]*rbacv3.Permission, []*rbacv3.Principal, error) {
		p, err := principalCondition(vs, nvs, one)
		return nil, p, err
	}
	switch {
	case k == "destination.ip":
		return perm(destinationIPPermission)
	case k == "destination.port":
		return perm(portPermission)
	case k == "connection.sni":
		return perm(sniPermission)
	case k == "source.ip":
		return princ(directIPPrincipal)
	case k == "remote.ip":
		return princ(remoteIPPrincipal)
	case k == "source.namespace":
		return princ(namespacePrincipal)
	case k == "source.principal":
		return princ(principalPrincipal)
	case k == "source.serviceAccount":
		return princ(func(v string) (*rbacv3.Principal, error) { return serviceAccountPrincipal(ns, v) })
	case k == "source.trustDomain":
		return princ(trustDomainPrincipal)
	case k == "request.auth.principal", k == "request.auth.audiences", k == "request.auth.presenter",
		strings.HasPrefix(k, "request.auth.claims["):
		return princ(requestAuthPrincipal)
	case strings.HasPrefix(k, "request.headers["):
		name, ok := strings.CutSuffix(strings.TrimPrefix(k, "request.headers["), "]")
		if !ok || name == "" {
			return nil, nil, fmt.Errorf("condition key %q: %w", k, errUnsupported)
		}
		return princ(func(v string) (*rbacv3.Principal, error) {
			h, err := headerMatcher(name, v, false)
			if err != nil {
				return nil, err
			}
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: h}}, nil
		})
	}
	return nil, nil, fmt.Errorf("condition key %q: %w", k, errUnsupported)
}

// permissionCondition: one of values, and none of notValues.
func permissionCondition(values, notValues []string, one func(string) (*rbacv3.Permission, error)) ([]*rbacv3.Permission, error) {
	var out []*rbacv3.Permission
	for i, vs := range [][]string{values, notValues} {
		if len(vs) == 0 {
			continue
		}
		var or []*rbacv3.Permission
		for _, v := range vs {
			p, err := one(v)
			if err != nil {
				return nil, err
			}
			or = append(or, p)
		}
		p := orPermissions(or)
		if i == 1 {
			p = &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: p}}
		}
		out = append(out, p)
	}
	return out, nil
}

// principalCondition: one of values, and none of notValues.
func principalCondition(values, notValues []string, one func(string) (*rbacv3.Principal, error)) ([]*rbacv3.Principal, error) {
	var out []*rbacv3.Principal
	for i, vs := range [][]string{values, notValues} {
		if len(vs) == 0 {
			continue
		}
		var or []*rbacv3.Principal
		for _, v := range vs {
			p, err := one(v)
			if err != nil {
				return nil, err
			}
			or = append(or, p)
		}
		p := orPrincipals(or)
		if i == 1 {
			p = &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: p}}
		}
		out = append(out, p)
	}
	return out, nil
}

func orPermissions(ps []*rbacv3.Permission) *rbacv3.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: ps}}}
}

func andPermissions(ps []*rbacv3.Permission) *rbacv3.Permission {
	switch len(ps) {
	case 0:
		return anyPermission()
	case 1:
		return ps[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: ps}}}
}

func orPrincipals(ps []*rbacv3.Principal) *rbacv3.Principal {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: ps}}}
}

func andPrincipals(ps []*rbacv3.Principal) *rbacv3.Principal {
	switch len(ps) {
	case 0:
		return anyPrincipal()
	case 1:
		return ps[0]
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: ps}}}
}

// wildcard is Istio's value match: "*" any non-empty value, "*x" a
// suffix, "x*" a prefix, else exact; prefix is prepended to the value.
func wildcard(v, prefix string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return regexMatcher(regexp.QuoteMeta(prefix) + ".+")
	case strings.HasPrefix(v, "*") && prefix == "":
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: v[1:]}}
	case strings.HasPrefix(v, "*"):
		return regexMatcher(regexp.QuoteMeta(prefix) + ".*" + regexp.QuoteMeta(v[1:]))
	case strings.HasSuffix(v, "*"):
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix + v[:len(v)-1]}}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: prefix + v}}
}

func regexMatcher(re string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

// authenticated matches the peer certificate's identity (its first URI
// SAN, the SPIFFE ID).
func authenticated(m *matcherv3.StringMatcher) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m}}}
}

// principalPrincipal: source.principals, "<trust domain>/ns/<ns>/sa/<sa>".
func principalPrincipal(v string) (*rbacv3.Principal, error) {
	return authenticated(wildcard(v, "spiffe://")), nil
}

// namespacePrincipal: source.namespaces; "*" in a value matches any run
// of characters.
func namespacePrincipal(v string) (*rbacv3.Principal, error) {
	return authenticated(regexMatcher(".*/ns/" + starRegex(v) + "/.*")), nil
}

// serviceAccountPrincipal: source.serviceAccounts, "<sa>" (of the
// policy's namespace) or "<ns>/<sa>".
func serviceAccountPrincipal(policyNS, v string) (*rbacv3.Principal, error) {
	ns, sa, ok := strings.Cut(v, "/")
	if !ok {
		ns, sa = policyNS, v
	}
	return authenticated(regexMatcher("spiffe://.+/ns/" + regexp.QuoteMeta(ns) + "/(.+/|)sa/" + regexp.QuoteMeta(sa) + "(/.+)?")), nil
}

// trustDomainPrincipal: source.trustDomains; "*" alone is any trust
// domain, elsewhere any run of characters within the trust domain.
func trustDomainPrincipal(v string) (*rbacv3.Principal, error) {
	switch {
	case v == "*":
		return authenticated(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://"}}), nil
	case !strings.Contains(v, "*"):
		return authenticated(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + v + "/"}}), nil
	}
	parts := strings.Split(v, "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return authenticated(regexMatcher("spiffe://" + strings.Join(parts, "[^/]*") + "/.*")), nil
}

// requestAuthPrincipal: a request principal, audience, presenter or claim.
// A proxyless server authenticates no requests, so none matches.
func requestAuthPrincipal(string) (*rbacv3.Principal, error) { return neverPrincipal(), nil }

func starRegex(v string) string {
	parts := strings.Split(v, "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return strings.Join(parts, ".*")
}

func cidr(v string) (*corev3.CidrRange, error) {
	if pfx, err := netip.ParsePrefix(v); err == nil {
		return &corev3.CidrRange{AddressPrefix: pfx.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(pfx.Bits()))}, nil
	}
	ip, err := netip.ParseAddr(v)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", v, errUnsupported)
	}
	return &corev3.CidrRange{AddressPrefix: ip.String(), PrefixLen: wrapperspb.UInt32(uint32(ip.BitLen()))}, nil
}

func directIPPrincipal(v string) (*rbacv3.Principal, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: c}}, nil
}

func remoteIPPrincipal(v string) (*rbacv3.Principal, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: c}}, nil
}

func destinationIPPermission(v string) (*rbacv3.Permission, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationIp{DestinationIp: c}}, nil
}

func portPermission(v string) (*rbacv3.Permission, error) {
	p, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", v, errUnsupported)
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: uint32(p)}}, nil
}

// sniPermission: gRPC matches the requested server name against "".
func sniPermission(v string) (*rbacv3.Permission, error) {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_RequestedServerName{RequestedServerName: wildcard(v, "")}}, nil
}

// hostPermission: the :authority, compared without case.
func hostPermission(v string) (*rbacv3.Permission, error) {
	h, err := headerMatcher(":authority", v, true)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: h}}, nil
}

// methodPermission: gRPC's :method is always POST.
func methodPermission(v string) (*rbacv3.Permission, error) {
	h, err := headerMatcher(":method", v, false)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: h}}, nil
}

// pathPermission: a gRPC path is "/<service>/<method>". Path templates
// ("{*}", "{**}") need a matcher gRPC does not implement.
func pathPermission(v string) (*rbacv3.Permission, error) {
	if strings.ContainsAny(v, "{}") {
		return nil, fmt.Errorf("path template %q: %w", v, errUnsupported)
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{
		Rule: &matcherv3.PathMatcher_Path{Path: wildcard(v, "")},
	}}}, nil
}

// headerMatcher matches header name against an Istio value; "*" means
// present. gRPC rejects matchers on :scheme and grpc- headers.
func headerMatcher(name, v string, ignoreCase bool) (*routev3.HeaderMatcher, error) {
	lower := strings.ToLower(name)
	if lower == ":scheme" || strings.HasPrefix(lower, "grpc-") {
		return nil, fmt.Errorf("header %q: %w", name, errUnsupported)
	}
	if v == "*" {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}, nil
	}
	m := wildcard(v, "")
	m.IgnoreCase = ignoreCase
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: m}}, nil
}
