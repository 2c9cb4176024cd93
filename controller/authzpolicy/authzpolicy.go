package authzpolicy

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
