package sidecar

import (
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTCPRuleSets: over TCP a DENY or AUDIT rule never covers less than
// over HTTP, and an ALLOW rule never allows more; a policy without rules
// never matches, whatever its action; dry-run policies become shadow
// rules.
func TestTCPRuleSets(t *testing.T) {
	httpOnly := &securityapi.Rule{
		From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"attacker"}, RequestPrincipals: []string{"*"}}}},
		To:   []*securityapi.Rule_To{{Operation: &securityapi.Operation{Ports: []string{"8080"}, Paths: []string{"/admin"}, Methods: []string{"POST"}}}},
		When: []*securityapi.Condition{{Key: "request.headers[x-user]", Values: []string{"a"}}, {Key: "source.ip", Values: []string{"10.0.0.1"}}},
	}
	l4 := &securityapi.Rule{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"ops"}}}}}
	policy := func(dry bool, rules ...*securityapi.Rule) *securityv1.AuthorizationPolicy {
		ap := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}, Spec: securityapi.AuthorizationPolicy{Rules: rules}}
		if dry {
			ap.Annotations = map[string]string{"istio.io/dry-run": "true"}
		}
		return ap
	}
	wantDeny := &securityapi.Rule{
		From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"attacker"}}}},
		To:   []*securityapi.Rule_To{{Operation: &securityapi.Operation{Ports: []string{"8080"}}}},
		When: []*securityapi.Condition{{Key: "source.ip", Values: []string{"10.0.0.1"}}},
	}
	set := func(action rbacv3.RBAC_Action, rules map[string]*rbacv3.Policy) *rbacv3.RBAC {
		return &rbacv3.RBAC{Action: action, Policies: rules}
	}
	deny, allow, log := rbacv3.RBAC_DENY, rbacv3.RBAC_ALLOW, rbacv3.RBAC_LOG
	for _, tt := range []struct {
		name   string
		action rbacv3.RBAC_Action
		in     *securityv1.AuthorizationPolicy
		want   rbacRuleSets
	}{
		{name: "DENY loses HTTP fields", action: deny, in: policy(false, httpOnly, l4), want: rbacRuleSets{rules: set(deny, map[string]*rbacv3.Policy{
			"ns[default]-policy[p]-rule[0]": rbacPolicy(deny, "default", wantDeny), "ns[default]-policy[p]-rule[1]": rbacPolicy(deny, "default", l4),
		})}},
		{name: "AUDIT loses HTTP fields", action: log, in: policy(false, httpOnly), want: rbacRuleSets{rules: set(log, map[string]*rbacv3.Policy{
			"ns[default]-policy[p]-rule[0]": rbacPolicy(log, "default", wantDeny),
		})}},
		{name: "ALLOW drops rules with HTTP fields", action: allow, in: policy(false, httpOnly, l4), want: rbacRuleSets{rules: set(allow, map[string]*rbacv3.Policy{
			"ns[default]-policy[p]-rule[1]": rbacPolicy(allow, "default", l4),
		})}},
		{name: "ALLOW of HTTP rules only allows nothing", action: allow, in: policy(false, httpOnly), want: rbacRuleSets{rules: set(allow, map[string]*rbacv3.Policy{})}},
		{name: "DENY without rules never matches", action: deny, in: policy(false), want: rbacRuleSets{rules: set(deny, map[string]*rbacv3.Policy{
			"ns[default]-policy[p]-rule[0]": neverPolicy(),
		})}},
		{name: "dry run is shadow rules", action: deny, in: policy(true, l4), want: rbacRuleSets{shadow: set(deny, map[string]*rbacv3.Policy{
			"ns[default]-policy[p]-rule[0]": rbacPolicy(deny, "default", l4),
		})}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := envoyRuleSets(tt.action, []*securityv1.AuthorizationPolicy{tt.in}, true, envoyPolicyName)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), cmp.AllowUnexported(rbacRuleSets{})); diff != "" {
				t.Errorf("rule sets over TCP (-want +got):\n%s", diff)
			}
		})
	}
}
