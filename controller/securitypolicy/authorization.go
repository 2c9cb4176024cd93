package securitypolicy

import (
	"fmt"
	"strconv"

	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
)

// AnnotationDryRun marks a policy that is evaluated and logged only.
const AnnotationDryRun = "istio.io/dry-run"

// DryRun reports whether p is a dry run, reading the annotation as istiod
// does (strconv.ParseBool: "true", "True", "TRUE", "t", "T" and "1" are a
// dry run). A value that does not parse is enforced, as in istiod, and
// returned as an error for the policy's status: a typo must never make an
// enforced policy a dry run, nor the other way round without a word.
func DryRun(p *securityv1.AuthorizationPolicy) (bool, error) {
	v, ok := p.Annotations[AnnotationDryRun]
	if !ok || v == "" {
		return false, nil
	}
	dry, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("annotation %s=%q is not a boolean: the policy is enforced", AnnotationDryRun, v)
	}
	return dry, nil
}

// IsDryRun is DryRun without the error, for translations that report it
// elsewhere.
func IsDryRun(p *securityv1.AuthorizationPolicy) bool {
	dry, _ := DryRun(p)
	return dry
}

// CustomDeniedSuffix ends the name of each rule of a CUSTOM policy that is
// enforced as a DENY rule, the suffix istiod gives the rules of a CUSTOM
// policy whose extension provider it cannot use.
const CustomDeniedSuffix = "-deny-due-to-bad-CUSTOM-action"

// CustomAsDeny explains why a CUSTOM policy is enforced as a DENY policy:
// Canopy implements no external authorization (Envoy's ext_authz) and reads
// no mesh extension providers, so every CUSTOM policy is in the state
// istiod calls a bad CUSTOM action, and fails closed the way istiod does
// then: requests its rules match are denied. Over plain TCP a rule is
// matched on its L4 attributes only, so a rule on paths or methods denies
// every connection of the workloads it selects.
const CustomAsDeny = "CUSTOM action enforced as DENY of its rules: Canopy has no external authorization provider"

// EnforcedAction is the action the data planes enforce for p: CUSTOM
// becomes DENY (CustomAsDeny); ALLOW, DENY and AUDIT are themselves.
func EnforcedAction(p *securityv1.AuthorizationPolicy) securityapi.AuthorizationPolicy_Action {
	if a := p.Spec.GetAction(); a != securityapi.AuthorizationPolicy_CUSTOM {
		return a
	}
	return securityapi.AuthorizationPolicy_DENY
}

// InScope reports whether a policy of namespace policyNS may apply to a
// workload of namespace ns: a namespace's policies apply there, the root
// namespace's everywhere.
func InScope(policyNS, ns, rootNS string) bool {
	return policyNS == ns || policyNS == rootNS
}

// BindsToWorkloads reports whether a policy applies to workloads through
// its selector. One with targetRef or targetRefs binds to the gateways,
// waypoints or services they name instead, and applies to no workload of
// its own (istiod sends ztunnel nothing for it, and sidecars no RBAC).
func BindsToWorkloads(p *securityv1.AuthorizationPolicy) bool {
	return p.Spec.GetTargetRef() == nil && len(p.Spec.GetTargetRefs()) == 0
}

// HasSelector reports whether a policy has a selector, even an empty one:
// such a policy is listed on each workload it selects (scope
// WORKLOAD_SELECTOR for node proxies), one without applies to its
// namespace, or from the root namespace to the mesh, as a whole.
func HasSelector(p *securityv1.AuthorizationPolicy) bool {
	return p != nil && p.Spec.GetSelector() != nil
}

// Selects reports whether a policy selects a workload with labels lbls,
// its scope aside: one without a selector, or with `selector: {}`, selects
// every workload; otherwise the workload has every label of matchLabels.
func Selects(p *securityv1.AuthorizationPolicy, lbls map[string]string) bool {
	return matchLabels(p.Spec.GetSelector().GetMatchLabels(), lbls)
}

// AppliesTo reports whether a policy applies to a workload of namespace ns
// with labels lbls: in scope, bound to workloads and selecting it. Dry
// runs apply too; whether they are enforced is DryRun's to say.
func AppliesTo(p *securityv1.AuthorizationPolicy, rootNS, ns string, lbls map[string]string) bool {
	return InScope(p.Namespace, ns, rootNS) && BindsToWorkloads(p) && Selects(p, lbls)
}

// matchLabels reports whether lbls has every label of sel.
func matchLabels(sel, lbls map[string]string) bool {
	for k, v := range sel {
		if got, ok := lbls[k]; !ok || got != v {
			return false
		}
	}
	return true
}
