package authzpolicy

import (
	"testing"

	securityapi "istio.io/api/security/v1beta1"
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
