package sidecar

import (
	"maps"
	"slices"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
)

// Stat prefixes of an Envoy sidecar's RBAC filters, as Istio's dashboards
// read them: the TCP filter's, and the shadow rules' of dry-run policies.
const (
	tcpRBACStatPrefix       = "tcp."
	dryRunAllowStatPrefix   = "istio_dry_run_allow_"
	dryRunDenyStatPrefix    = "istio_dry_run_deny_"
	rbacHTTPFilterName      = "envoy.filters.http.rbac"
	rbacNetworkFilterName   = "envoy.filters.network.rbac"
	customProviderKeyPrefix = "istio-ext-authz-"
)

// envoyPolicies are the AuthorizationPolicies that select an Envoy
// sidecar's workload, by action, oldest first; dry-run ones among them
// (CUSTOM ones excepted: a CUSTOM policy in dry run has no effect).
type envoyPolicies struct {
	custom, audit, deny, allow []*securityv1.AuthorizationPolicy
}

func (m *Mesh) envoyPolicies(p Proxy) envoyPolicies {
	m.readKind(authorizationPolicies)
	var out envoyPolicies
	for _, ap := range m.authorizationPolicies {
		if !securitypolicy.AppliesTo(ap, m.RootNamespace, p.Namespace, p.Labels) {
			continue
		}
		switch ap.Spec.GetAction() {
		case securityapi.AuthorizationPolicy_CUSTOM:
			if !securitypolicy.IsDryRun(ap) {
				out.custom = append(out.custom, ap)
			}
		case securityapi.AuthorizationPolicy_AUDIT:
			out.audit = append(out.audit, ap)
		case securityapi.AuthorizationPolicy_DENY:
			out.deny = append(out.deny, ap)
		case securityapi.AuthorizationPolicy_ALLOW:
			out.allow = append(out.allow, ap)
		}
	}
	return out
}

// rbacRuleSets are one action's rules on a sidecar chain: those of the
// enforced policies, and the shadow rules of the dry-run ones (Envoy
// evaluates and counts them, and enforces nothing); nil when no policy of
// the kind applies.
type rbacRuleSets struct{ rules, shadow *rbacv3.RBAC }

// envoyRuleSets translates policies of one action for an HTTP chain, or a
// TCP one (forTCP), as istiod does for Envoy: rule i of policy ns/name is
// "ns[<ns>]-policy[<name>]-rule[<i>]" (name may change that); a policy
// without rules is one policy that never matches. Over TCP, where nothing
// of HTTP can be seen, an ALLOW rule that needs HTTP is left out (it
// allows nothing) and a DENY or AUDIT rule loses its HTTP parts (it covers
// at least what it covers over HTTP).
func envoyRuleSets(action rbacv3.RBAC_Action, policies []*securityv1.AuthorizationPolicy, forTCP bool, name func(*securityv1.AuthorizationPolicy, int) string) rbacRuleSets {
	var out rbacRuleSets
	for _, ap := range policies {
		set := &out.rules
		if securitypolicy.IsDryRun(ap) && ap.Spec.GetAction() != securityapi.AuthorizationPolicy_CUSTOM {
			set = &out.shadow
		}
		if *set == nil {
			*set = &rbacv3.RBAC{Action: action, Policies: map[string]*rbacv3.Policy{}}
		}
		rules := ap.Spec.GetRules()
		if len(rules) == 0 {
			(*set).Policies[name(ap, 0)] = neverPolicy()
		}
		for i, r := range rules {
			if forTCP && usesHTTP(r) {
				if action == rbacv3.RBAC_ALLOW {
					continue
				}
				r = withoutHTTP(r)
			}
			(*set).Policies[name(ap, i)] = rbacPolicy(action, ap.Namespace, r)
		}
	}
	return out
}

// shadowStatPrefix is where a dry-run rule set's decisions are counted.
func shadowStatPrefix(shadow *rbacv3.RBAC) string {
	switch shadow.GetAction() {
	case rbacv3.RBAC_ALLOW:
		return dryRunAllowStatPrefix
	case rbacv3.RBAC_DENY:
		return dryRunDenyStatPrefix
	}
	return ""
}

// envoyRBAC are the rule sets of a sidecar's chains in istiod's order:
// CUSTOM policies' rules enforced as DENY (one set per extension provider,
// by name), then AUDIT (logged), DENY and ALLOW.
func (m *Mesh) envoyRBAC(p Proxy, forTCP bool) []rbacRuleSets {
	ps := m.envoyPolicies(p)
	var out []rbacRuleSets
	byProvider := map[string][]*securityv1.AuthorizationPolicy{}
	for _, ap := range ps.custom {
		byProvider[ap.Spec.GetProvider().GetName()] = append(byProvider[ap.Spec.GetProvider().GetName()], ap)
	}
	for _, provider := range slices.Sorted(maps.Keys(byProvider)) {
		prefix := customProviderKeyPrefix
		if provider != "" {
			prefix += provider + "-"
		}
		named := func(ap *securityv1.AuthorizationPolicy, i int) string {
			return prefix + envoyPolicyName(ap, i) + securitypolicy.CustomDeniedSuffix
		}
		out = append(out, envoyRuleSets(rbacv3.RBAC_DENY, byProvider[provider], forTCP, named))
	}
	for _, a := range []struct {
		action   rbacv3.RBAC_Action
		policies []*securityv1.AuthorizationPolicy
	}{{rbacv3.RBAC_LOG, ps.audit}, {rbacv3.RBAC_DENY, ps.deny}, {rbacv3.RBAC_ALLOW, ps.allow}} {
		if len(a.policies) > 0 {
			out = append(out, envoyRuleSets(a.action, a.policies, forTCP, envoyPolicyName))
		}
	}
	return out
}

// httpRBAC are the HTTP RBAC filters of the AuthorizationPolicies that
// select the proxy (envoyRBAC).
func (m *Mesh) httpRBAC(p Proxy) []*hcmv3.HttpFilter {
	var out []*hcmv3.HttpFilter
	for _, s := range m.envoyRBAC(p, false) {
		out = append(out, &hcmv3.HttpFilter{Name: rbacHTTPFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbacfilterv3.RBAC{
			Rules: s.rules, ShadowRules: s.shadow, ShadowRulesStatPrefix: shadowStatPrefix(s.shadow),
		})}})
	}
	return out
}

// networkRBAC are the network RBAC filters of the AuthorizationPolicies
// that select the proxy, for its TCP chains (envoyRBAC).
func (m *Mesh) networkRBAC(p Proxy) []*listenerv3.Filter {
	var out []*listenerv3.Filter
	for _, s := range m.envoyRBAC(p, true) {
		out = append(out, &listenerv3.Filter{Name: rbacNetworkFilterName, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&rbacnetv3.RBAC{
			StatPrefix: tcpRBACStatPrefix, Rules: s.rules, ShadowRules: s.shadow, ShadowRulesStatPrefix: shadowStatPrefix(s.shadow),
		})}})
	}
	return out
}
