package sidecar

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTCPPolicies: over TCP a DENY rule never denies less than over HTTP,
// and an ALLOW rule never allows more.
func TestTCPPolicies(t *testing.T) {
	httpOnly := &securityapi.Rule{
		From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"attacker"}, RequestPrincipals: []string{"*"}}}},
		To:   []*securityapi.Rule_To{{Operation: &securityapi.Operation{Ports: []string{"8080"}, Paths: []string{"/admin"}, Methods: []string{"POST"}}}},
		When: []*securityapi.Condition{{Key: "request.headers[x-user]", Values: []string{"a"}}, {Key: "source.ip", Values: []string{"10.0.0.1"}}},
	}
	l4 := &securityapi.Rule{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"ops"}}}}}
	policy := func(rules ...*securityapi.Rule) *securityv1.AuthorizationPolicy {
		return &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}, Spec: securityapi.AuthorizationPolicy{Rules: rules}}
	}
	wantDeny := &securityapi.Rule{
		From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"attacker"}}}},
		To:   []*securityapi.Rule_To{{Operation: &securityapi.Operation{Ports: []string{"8080"}}}},
		When: []*securityapi.Condition{{Key: "source.ip", Values: []string{"10.0.0.1"}}},
	}
	for _, tt := range []struct {
		name string
		deny bool
		in   *securityv1.AuthorizationPolicy
		want [][]*securityapi.Rule // rules of each policy left
	}{
		{name: "DENY loses HTTP fields", deny: true, in: policy(httpOnly, l4), want: [][]*securityapi.Rule{{wantDeny, l4}}},
		{name: "ALLOW drops rules with HTTP fields", in: policy(httpOnly, l4), want: [][]*securityapi.Rule{{l4}}},
		{name: "ALLOW of HTTP rules only allows nothing", in: policy(httpOnly), want: [][]*securityapi.Rule{nil}},
		{name: "L4 rules unchanged", deny: true, in: policy(l4), want: [][]*securityapi.Rule{{l4}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got [][]*securityapi.Rule
			for _, ap := range tcpPolicies(tt.deny, []*securityv1.AuthorizationPolicy{tt.in}) {
				got = append(got, ap.Spec.GetRules())
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("rules over TCP (-want +got):\n%s", diff)
			}
		})
	}
}
