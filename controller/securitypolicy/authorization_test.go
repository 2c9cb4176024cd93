package securitypolicy

import (
	"testing"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDryRun(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		annotations map[string]string
		want        bool
		wantErr     bool
	}{
		{annotations: nil},
		{annotations: map[string]string{AnnotationDryRun: ""}},
		{annotations: map[string]string{AnnotationDryRun: "true"}, want: true},
		{annotations: map[string]string{AnnotationDryRun: "True"}, want: true},
		{annotations: map[string]string{AnnotationDryRun: "TRUE"}, want: true},
		{annotations: map[string]string{AnnotationDryRun: "t"}, want: true},
		{annotations: map[string]string{AnnotationDryRun: "1"}, want: true},
		{annotations: map[string]string{AnnotationDryRun: "false"}},
		{annotations: map[string]string{AnnotationDryRun: "0"}},
		{annotations: map[string]string{AnnotationDryRun: "yes"}, wantErr: true},
		{annotations: map[string]string{AnnotationDryRun: " true"}, wantErr: true},
	} {
		p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Annotations: tt.annotations}}
		got, err := DryRun(p)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("DryRun(%q) = %v, %v; want %v, error %v", tt.annotations, got, err, tt.want, tt.wantErr)
		}
		if IsDryRun(p) != tt.want {
			t.Errorf("IsDryRun(%q) = %v, want %v", tt.annotations, !tt.want, tt.want)
		}
	}
}

func TestEnforcedAction(t *testing.T) {
	t.Parallel()
	for in, want := range map[securityapi.AuthorizationPolicy_Action]securityapi.AuthorizationPolicy_Action{
		securityapi.AuthorizationPolicy_ALLOW:  securityapi.AuthorizationPolicy_ALLOW,
		securityapi.AuthorizationPolicy_DENY:   securityapi.AuthorizationPolicy_DENY,
		securityapi.AuthorizationPolicy_AUDIT:  securityapi.AuthorizationPolicy_AUDIT,
		securityapi.AuthorizationPolicy_CUSTOM: securityapi.AuthorizationPolicy_DENY,
	} {
		p := &securityv1.AuthorizationPolicy{}
		p.Spec.Action = in
		if got := EnforcedAction(p); got != want {
			t.Errorf("EnforcedAction(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestAppliesTo(t *testing.T) {
	t.Parallel()
	const root = "istio-system"
	web := map[string]string{"app": "web", "version": "v1"}
	policy := func(ns string, sel map[string]string, targeted bool) *securityv1.AuthorizationPolicy {
		p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
		if sel != nil {
			p.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: sel}
		}
		if targeted {
			p.Spec.TargetRefs = []*typeapi.PolicyTargetReference{{Kind: "Service", Name: "web"}}
		}
		return p
	}
	for _, tt := range []struct {
		name        string
		p           *securityv1.AuthorizationPolicy
		ns          string
		want        bool
		hasSelector bool
	}{
		{"no selector: the whole namespace", policy("shop", nil, false), "shop", true, false},
		{"selector {}: every workload, listed on each", policy("shop", map[string]string{}, false), "shop", true, true},
		{"a selector the workload matches", policy("shop", map[string]string{"app": "web"}, false), "shop", true, true},
		{"a selector the workload does not match", policy("shop", map[string]string{"app": "db"}, false), "shop", false, true},
		{"a label the workload lacks", policy("shop", map[string]string{"app": "web", "tier": "front"}, false), "shop", false, true},
		{"another namespace's", policy("other", nil, false), "shop", false, false},
		{"the root namespace's, in every namespace", policy(root, map[string]string{"app": "web"}, false), "shop", true, true},
		{"targetRefs bind to what they name, no workload", policy("shop", nil, true), "shop", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := AppliesTo(tt.p, root, tt.ns, web); got != tt.want {
				t.Errorf("AppliesTo = %v, want %v", got, tt.want)
			}
			if got := HasSelector(tt.p); got != tt.hasSelector {
				t.Errorf("HasSelector = %v, want %v", got, tt.hasSelector)
			}
		})
	}
	if HasSelector(nil) {
		t.Error("HasSelector(nil) = true")
	}
}
