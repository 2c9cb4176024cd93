package sidecar

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
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

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
)

// RBAC filter names on a proxyless server's chain: the DENY filter runs
// first, then the ALLOW filter (Istio's order; gRPC supports only these two
// actions).
const (
	RBACDenyFilter  = "envoy.filters.http.rbac.DENY"
	RBACAllowFilter = "envoy.filters.http.rbac"
)

// errUnsupported: a condition gRPC's RBAC engine cannot evaluate, or would
// reject.
var errUnsupported = errors.New("not supported by gRPC")

// Policies are the AuthorizationPolicies that apply to one workload, by
// the action its data plane enforces, oldest first.
type Policies struct {
	// Custom are the CUSTOM policies. Canopy implements no external
	// authorizer, so they are enforced as DENY policies of their rules
	// (securitypolicy.CustomAsDeny), which is what istiod does for a CUSTOM
	// policy whose provider it cannot use. istiod gives proxyless servers
	// nothing for them, which leaves what they protect open; Canopy denies
	// there too.
	Custom []*securityv1.AuthorizationPolicy
	Deny   []*securityv1.AuthorizationPolicy
	Allow  []*securityv1.AuthorizationPolicy
}

// AuthorizationPolicies returns the policies that apply to a workload of
// namespace ns with labels lbls: those of the root namespace and of ns
// without a selector or whose selector's labels the workload has.
// Policies with targetRefs (gateways and waypoints only), AUDIT policies
// (logging only; neither data plane here logs them) and dry-run policies
// (Canopy generates no shadow rules) are left out.
func (m *Mesh) AuthorizationPolicies(ns string, lbls map[string]string) Policies {
	ps := m.envoyPolicies(Proxy{Namespace: ns, Labels: lbls})
	enforced := func(aps []*securityv1.AuthorizationPolicy) []*securityv1.AuthorizationPolicy {
		return slices.DeleteFunc(slices.Clone(aps), securitypolicy.IsDryRun)
	}
	return Policies{Custom: ps.custom, Deny: enforced(ps.deny), Allow: enforced(ps.allow)}
}

// grpcRBACFilters are the RBAC filters for a proxyless server: a DENY
// filter when a DENY or CUSTOM policy has a rule, then an ALLOW filter
// when an ALLOW policy applies. Each rule i of policy ns/name is the RBAC
// policy "<ns>-<name>-<i>", with securitypolicy.CustomDeniedSuffix for a
// CUSTOM policy's.
//
// A DENY policy without rules denies nothing, so it adds no RBAC policy
// (and alone no filter), as istiod does. An ALLOW policy without rules
// allows nothing: it is one RBAC policy that never matches. istiod leaves
// it out, which on a server with no other ALLOW policy drops the ALLOW
// filter and so allows everything.
func (m *Mesh) grpcRBACFilters(p Proxy) []*hcmv3.HttpFilter {
	ps := m.AuthorizationPolicies(p.Namespace, p.Labels)
	var out []*hcmv3.HttpFilter
	rules := rbacRules(rbacv3.RBAC_DENY, ps.Deny, rbacPolicyName)
	for name, pol := range rbacRules(rbacv3.RBAC_DENY, ps.Custom, rbacPolicyName).Policies {
		rules.Policies[name+securitypolicy.CustomDeniedSuffix] = pol
	}
	if len(rules.Policies) > 0 {
		out = append(out, rbacFilter(RBACDenyFilter, rules))
	}
	if rules := rbacRules(rbacv3.RBAC_ALLOW, ps.Allow, rbacPolicyName); len(rules.Policies) > 0 {
		out = append(out, rbacFilter(RBACAllowFilter, rules))
	}
	return out
}

func rbacFilter(name string, rules *rbacv3.RBAC) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbacfilterv3.RBAC{Rules: rules})}}
}

// rbacRules translates policies; name keys rule i of a policy.
func rbacRules(action rbacv3.RBAC_Action, policies []*securityv1.AuthorizationPolicy, name func(*securityv1.AuthorizationPolicy, int) string) *rbacv3.RBAC {
	out := &rbacv3.RBAC{Action: action, Policies: map[string]*rbacv3.Policy{}}
	for _, ap := range policies {
		rules := ap.Spec.GetRules()
		if len(rules) == 0 && action == rbacv3.RBAC_ALLOW {
			out.Policies[name(ap, 0)] = neverPolicy()
		}
		for i, r := range rules {
			out.Policies[name(ap, i)] = rbacPolicy(action, ap.Namespace, r)
		}
	}
	return out
}

// envoyPolicyName is the key of a rule on an Envoy sidecar,
// "ns[<ns>]-policy[<name>]-rule[<i>]".
func envoyPolicyName(ap *securityv1.AuthorizationPolicy, i int) string {
	return "ns[" + ap.Namespace + "]-policy[" + ap.Name + "]-rule[" + strconv.Itoa(i) + "]"
}

// rbacPolicyName is istiod's key for a rule on a proxyless server.
func rbacPolicyName(ap *securityv1.AuthorizationPolicy, i int) string {
	return ap.Namespace + "-" + ap.Name + "-" + strconv.Itoa(i)
}

func neverPolicy() *rbacv3.Policy {
	return &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{notPermission(anyPermission())},
		Principals:  []*rbacv3.Principal{notPrincipal(anyPrincipal())},
	}
}

func anyPermission() *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}}
}
func anyPrincipal() *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}}
}
func notPermission(p *rbacv3.Permission) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: p}}
}
func notPrincipal(p *rbacv3.Principal) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: p}}
}

// rbacPolicy translates one rule: it matches when one of its "to"
// operations and one of its "from" sources match, each with all "when"
// conditions.
//
// The shape is the one istiod gives a proxyless server, so that the two
// control planes send the same bytes: each operation (source) is an
// and_rules (and_ids) of its fields, followed by the "when" conditions,
// or of {any: true} when there are none; a field's values are an or_rules
// (or_ids), even a single one, and its excluded values the not_rule
// (not_id) of one; the request authentication attributes are the JWT
// metadata matchers istiod writes (which grpc-go never matches, see
// requestPrincipals).
//
// A value gRPC cannot evaluate, or would reject, makes an ALLOW rule match
// nothing (allowing less) and drops its field or condition from a DENY
// rule (denying more), as Istio treats conditions a proxy cannot enforce.
// istiod sends such values as they are, and grpc-go then rejects the whole
// listener.
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

// permField turns the values of one field into one permission.
type permField func(values []string) (*rbacv3.Permission, error)

// princField turns the values of one field into one principal.
type princField func(values []string) (*rbacv3.Principal, error)

// eachPermission is a field matched by any of its values, one permission
// each.
func eachPermission(one func(string) (*rbacv3.Permission, error)) permField {
	return func(values []string) (*rbacv3.Permission, error) {
		or := make([]*rbacv3.Permission, 0, len(values))
		for _, v := range values {
			p, err := one(v)
			if err != nil {
				return nil, err
			}
			or = append(or, p)
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: or}}}, nil
	}
}

// eachPrincipal is a field matched by any of its values, one principal
// each.
func eachPrincipal(one func(string) (*rbacv3.Principal, error)) princField {
	return func(values []string) (*rbacv3.Principal, error) {
		or := make([]*rbacv3.Principal, 0, len(values))
		for _, v := range values {
			p, err := one(v)
			if err != nil {
				return nil, err
			}
			or = append(or, p)
		}
		return orPrincipals(or), nil
	}
}

// operation is the permissions an operation requires: one of its hosts,
// methods, paths and ports each, and none of the excluded ones.
func operation(action rbacv3.RBAC_Action, o *securityapi.Operation) ([]*rbacv3.Permission, error) {
	var out []*rbacv3.Permission
	for _, f := range []struct {
		values, not []string
		field       permField
	}{
		{o.GetHosts(), o.GetNotHosts(), eachPermission(hostPermission)},
		{o.GetMethods(), o.GetNotMethods(), eachPermission(methodPermission)},
		{o.GetPaths(), o.GetNotPaths(), eachPermission(pathPermission)},
		{o.GetPorts(), o.GetNotPorts(), eachPermission(portPermission)},
	} {
		perm, err := permissionCondition(f.values, f.not, f.field)
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
		field       princField
	}{
		{s.GetPrincipals(), s.GetNotPrincipals(), eachPrincipal(principalPrincipal)},
		{s.GetRequestPrincipals(), s.GetNotRequestPrincipals(), requestPrincipals},
		{s.GetServiceAccounts(), s.GetNotServiceAccounts(), eachPrincipal(func(v string) (*rbacv3.Principal, error) { return serviceAccountPrincipal(ns, v) })},
		{s.GetTrustDomains(), s.GetNotTrustDomains(), eachPrincipal(trustDomainPrincipal)},
		{s.GetNamespaces(), s.GetNotNamespaces(), eachPrincipal(namespacePrincipal)},
		{s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), eachPrincipal(remoteIPPrincipal)},
		{s.GetIpBlocks(), s.GetNotIpBlocks(), eachPrincipal(directIPPrincipal)},
	} {
		princ, err := principalCondition(f.values, f.not, f.field)
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
	perm := func(f permField) ([]*rbacv3.Permission, []*rbacv3.Principal, error) {
		p, err := permissionCondition(vs, nvs, f)
		return p, nil, err
	}
	princ := func(f princField) ([]*rbacv3.Permission, []*rbacv3.Principal, error) {
		p, err := principalCondition(vs, nvs, f)
		return nil, p, err
	}
	switch {
	case k == "destination.ip":
		return perm(eachPermission(destinationIPPermission))
	case k == "destination.port":
		return perm(eachPermission(portPermission))
	case k == "connection.sni":
		return perm(eachPermission(sniPermission))
	case k == "source.ip":
		return princ(eachPrincipal(directIPPrincipal))
	case k == "remote.ip":
		return princ(eachPrincipal(remoteIPPrincipal))
	case k == "source.namespace":
		return princ(eachPrincipal(namespacePrincipal))
	case k == "source.principal":
		return princ(eachPrincipal(principalPrincipal))
	case k == "source.serviceAccount":
		return princ(eachPrincipal(func(v string) (*rbacv3.Principal, error) { return serviceAccountPrincipal(ns, v) }))
	case k == "source.trustDomain":
		return princ(eachPrincipal(trustDomainPrincipal))
	case k == "request.auth.principal":
		return princ(requestPrincipals)
	case k == "request.auth.audiences":
		return princ(jwtClaim([]string{"aud"}))
	case k == "request.auth.presenter":
		return princ(jwtClaim([]string{"azp"}))
	case strings.HasPrefix(k, "request.auth.claims["):
		path, err := claimPath(strings.TrimPrefix(k, "request.auth.claims"))
		if err != nil {
			return nil, nil, fmt.Errorf("condition key %q: %w", k, err)
		}
		return princ(jwtClaim(path))
	case strings.HasPrefix(k, "request.headers["):
		name, ok := strings.CutSuffix(strings.TrimPrefix(k, "request.headers["), "]")
		if !ok || name == "" {
			return nil, nil, fmt.Errorf("condition key %q: %w", k, errUnsupported)
		}
		return princ(eachPrincipal(func(v string) (*rbacv3.Principal, error) {
			h, err := headerMatcher(name, v, false)
			if err != nil {
				return nil, err
			}
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: h}}, nil
		}))
	}
	// Also experimental.envoy.filters.*: Envoy filter metadata, which a
	// gRPC server does not have.
	return nil, nil, fmt.Errorf("condition key %q: %w", k, errUnsupported)
}

// condition is a match of values, and none of notValues: f matches
// values, not negates a match.
func condition[T any](values, notValues []string, f func([]string) (T, error), not func(T) T) ([]T, error) {
	var out []T
	if len(values) > 0 {
		p, err := f(values)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(notValues) > 0 {
		p, err := f(notValues)
		if err != nil {
			return nil, err
		}
		out = append(out, not(p))
	}
	return out, nil
}

// permissionCondition is condition over permissions.
func permissionCondition(values, notValues []string, f permField) ([]*rbacv3.Permission, error) {
	return condition(values, notValues, f, notPermission)
}

// principalCondition is condition over principals.
func principalCondition(values, notValues []string, f princField) ([]*rbacv3.Principal, error) {
	return condition(values, notValues, f, notPrincipal)
}

// andPermissions: all of ps; {any: true} when there are none.
func andPermissions(ps []*rbacv3.Permission) *rbacv3.Permission {
	if len(ps) == 0 {
		ps = []*rbacv3.Permission{anyPermission()}
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: ps}}}
}

func orPrincipals(ps []*rbacv3.Principal) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: ps}}}
}

// andPrincipals: all of ps; {any: true} when there are none.
func andPrincipals(ps []*rbacv3.Principal) *rbacv3.Principal {
	if len(ps) == 0 {
		ps = []*rbacv3.Principal{anyPrincipal()}
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: ps}}}
}

// wildcard is Istio's value match: "*" any non-empty value, "*x" a
// suffix, "x*" a prefix, else exact; prefix is prepended to the value.
// "*" ignores prefix: as a principal it is any authenticated identity,
// SPIFFE ID or not, and istiod writes it so.
func wildcard(v, prefix string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return regexMatcher(".+")
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
	// Only the first "*" is a wildcard; a second one is a literal, as in
	// istiod (validation allows one).
	before, after, _ := strings.Cut(v, "*")
	return authenticated(regexMatcher("spiffe://" + regexp.QuoteMeta(before) + "[^/]*" + regexp.QuoteMeta(after) + "/.*")), nil
}

// JWT claims are matched in the dynamic metadata Envoy's JWT filter
// writes: filter jwtFilter, key jwtPayload, then the claim's path.
const (
	jwtFilter  = "envoy.filters.http.jwt_authn"
	jwtPayload = "payload"
)

// requestPrincipals: source.requestPrincipals and request.auth.principal,
// "<iss>/<sub>" (the issuer may contain "/"; the last one splits), as
// istiod writes them: each value the issuer and subject claims' metadata
// matchers, any value matching.
//
// A proxyless server authenticates no requests and has no metadata:
// grpc-go never matches a metadata matcher (and always matches its
// not_id), so a request principal never matches, which is what the
// attribute means on a server without request authentication.
func requestPrincipals(values []string) (*rbacv3.Principal, error) {
	or := make([]*rbacv3.Principal, 0, len(values))
	for _, v := range values {
		iss, sub := requestPrincipalMatchers(v)
		or = append(or, andPrincipals([]*rbacv3.Principal{
			metadataPrincipal(jwtMetadata([]string{"iss"}, stringValue(iss))),
			metadataPrincipal(jwtMetadata([]string{"sub"}, stringValue(sub))),
		}))
	}
	if len(or) == 1 {
		return or[0], nil
	}
	return orPrincipals(or), nil
}

// requestPrincipalMatchers are the issuer and subject matchers of a
// request principal: "*" anything, a leading "*" a suffix, a trailing "*"
// a prefix, of the issuer or subject the "/" splits off (or of the
// subject, or issuer, without one).
func requestPrincipalMatchers(v string) (iss, sub *matcherv3.StringMatcher) {
	anyValue := func() *matcherv3.StringMatcher { return regexMatcher(".+") }
	i := strings.LastIndex(v, "/")
	hasSub := i >= 0
	issuer, subject := v, ""
	if hasSub {
		issuer, subject = v[:i], v[i+1:]
	}
	switch {
	case v == "*":
		return anyValue(), anyValue()
	case strings.HasPrefix(v, "*") && hasSub:
		if issuer == "*" {
			return anyValue(), exactMatcher(subject)
		}
		return suffixMatcher(issuer[1:]), exactMatcher(subject)
	case strings.HasPrefix(v, "*"):
		return anyValue(), suffixMatcher(v[1:])
	case strings.HasSuffix(v, "*") && hasSub:
		if subject == "*" {
			return exactMatcher(issuer), anyValue()
		}
		return exactMatcher(issuer), prefixMatcher(subject[:len(subject)-1])
	case strings.HasSuffix(v, "*"):
		return prefixMatcher(v[:len(v)-1]), anyValue()
	}
	return exactMatcher(issuer), exactMatcher(subject)
}

// jwtClaim: request.auth.audiences, presenter and claims[...], a claim at
// path matching one of the values, whether it is a list or a single
// string. Never matches on a proxyless server (see requestPrincipals).
func jwtClaim(path []string) princField {
	return func(values []string) (*rbacv3.Principal, error) {
		value := func() *matcherv3.ValueMatcher {
			if len(values) == 1 {
				return stringValue(wildcard(values[0], ""))
			}
			or := make([]*matcherv3.ValueMatcher, 0, len(values))
			for _, v := range values {
				or = append(or, stringValue(wildcard(v, "")))
			}
			return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: or}}}
		}
		listOrString := &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: []*matcherv3.ValueMatcher{
			{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: value()}}}},
			value(),
		}}}}
		return metadataPrincipal(jwtMetadata(path, listOrString)), nil
	}
}

// claimPath is the claim path of a request.auth.claims key's brackets:
// "[a][b]" is a, then b. Anything else inside one pair of brackets is one
// claim name ("[a.b]", "[a[b]]").
func claimPath(brackets string) ([]string, error) {
	var path []string
	for rest := brackets; rest != ""; {
		name, after, ok := strings.Cut(strings.TrimPrefix(rest, "["), "]")
		if !strings.HasPrefix(rest, "[") || !ok || strings.Contains(name, "[") {
			path = nil
			break
		}
		path = append(path, name)
		rest = after
	}
	if path != nil {
		return path, nil
	}
	if inner, ok := strings.CutPrefix(brackets, "["); ok {
		if name, ok := strings.CutSuffix(inner, "]"); ok {
			return []string{name}, nil
		}
	}
	return nil, fmt.Errorf("claim %q: want [<name>]", brackets)
}

func jwtMetadata(path []string, value *matcherv3.ValueMatcher) *matcherv3.MetadataMatcher {
	segs := make([]*matcherv3.MetadataMatcher_PathSegment, 0, len(path)+1)
	for _, k := range append([]string{jwtPayload}, path...) {
		segs = append(segs, &matcherv3.MetadataMatcher_PathSegment{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: k}})
	}
	return &matcherv3.MetadataMatcher{Filter: jwtFilter, Path: segs, Value: value}
}

func metadataPrincipal(m *matcherv3.MetadataMatcher) *rbacv3.Principal {
	//lint:ignore SA1019 the field istiod writes and grpc-go reads (it has no sourced_metadata)
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Metadata{Metadata: m}}
}

func stringValue(m *matcherv3.StringMatcher) *matcherv3.ValueMatcher {
	return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: m}}
}

func exactMatcher(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
}

func prefixMatcher(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: s}}
}

func suffixMatcher(s string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}}
}

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
