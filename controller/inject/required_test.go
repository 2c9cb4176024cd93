package inject

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRequired(t *testing.T) {
	t.Parallel()
	pod := func(mod func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "demo"}}
		if mod != nil {
			mod(p)
		}
		return p
	}
	label := func(k, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels[k] = v
		}
	}
	annotate := func(k, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[k] = v
		}
	}
	both := func(mods ...func(*corev1.Pod)) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			for _, m := range mods {
				m(p)
			}
		}
	}
	enabled := map[string]string{"istio-injection": "enabled"}
	batch := []metav1.LabelSelector{{MatchLabels: map[string]string{"team": "none"}}, {MatchLabels: map[string]string{"app": "batch"}}}
	type result struct {
		Inject bool
		Reason string
	}
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		ns   map[string]string
		cfg  Config
		want result
	}{
		{
			name: "namespace istio-injection=enabled",
			pod:  pod(nil), ns: enabled,
			want: result{true, "namespace label istio-injection=enabled"},
		},
		{
			name: "namespace istio-injection=disabled",
			pod:  pod(label("istio.io/rev", "default")), ns: map[string]string{"istio-injection": "disabled", "istio.io/rev": "default"},
			want: result{false, "namespace label istio-injection=disabled"},
		},
		{
			name: "namespace istio-injection=enabled for a revisioned injector",
			pod:  pod(nil), ns: enabled, cfg: Config{Revision: "canary"},
			want: result{false, "namespace label istio-injection=enabled selects the default revision, not canary"},
		},
		{
			name: "namespace istio.io/rev matches",
			pod:  pod(nil), ns: map[string]string{"istio.io/rev": "canary"}, cfg: Config{Revision: "canary"},
			want: result{true, "namespace label istio.io/rev=canary"},
		},
		{
			name: "namespace istio.io/rev names another revision",
			pod:  pod(nil), ns: map[string]string{"istio.io/rev": "stable"}, cfg: Config{Revision: "canary"},
			want: result{false, "namespace selects revision stable, not canary"},
		},
		{
			name: "namespace istio.io/rev=default for the default injector",
			pod:  pod(nil), ns: map[string]string{"istio.io/rev": "default"},
			want: result{true, "namespace label istio.io/rev=default"},
		},
		{
			name: "namespace label beats the pod's revision label",
			pod:  pod(label("istio.io/rev", "other")), ns: map[string]string{"istio.io/rev": "default"},
			want: result{true, "namespace label istio.io/rev=default"},
		},
		{
			name: "pod istio.io/rev matches",
			pod:  pod(label("istio.io/rev", "canary")), cfg: Config{Revision: "canary"},
			want: result{true, "pod label istio.io/rev=canary"},
		},
		{
			name: "pod istio.io/rev names another revision",
			pod:  pod(label("istio.io/rev", "canary")),
			want: result{false, "pod selects revision canary, not default"},
		},
		{
			name: "pod label inject=true with no namespace labels",
			pod:  pod(label("sidecar.istio.io/inject", "true")),
			want: result{true, "pod label sidecar.istio.io/inject=true"},
		},
		{
			name: "pod label inject=true for a revisioned injector",
			pod:  pod(label("sidecar.istio.io/inject", "true")), cfg: Config{Revision: "canary"},
			want: result{false, "pod label sidecar.istio.io/inject=true selects the default revision, not canary"},
		},
		{
			name: "pod annotation inject=true alone selects nothing",
			pod:  pod(annotate("sidecar.istio.io/inject", "true")),
			want: result{false, "neither the namespace nor the pod selects a revision"},
		},
		{
			name: "nothing selects",
			pod:  pod(nil),
			want: result{false, "neither the namespace nor the pod selects a revision"},
		},
		{
			name: "pod label inject=false",
			pod:  pod(label("sidecar.istio.io/inject", "false")), ns: enabled,
			want: result{false, "pod label sidecar.istio.io/inject=false"},
		},
		{
			name: "pod annotation inject=false",
			pod:  pod(annotate("sidecar.istio.io/inject", "false")), ns: enabled,
			want: result{false, "pod annotation sidecar.istio.io/inject=false"},
		},
		{
			name: "label true beats annotation false",
			pod:  pod(both(label("sidecar.istio.io/inject", "true"), annotate("sidecar.istio.io/inject", "false"))), ns: enabled,
			want: result{true, "namespace label istio-injection=enabled, pod label sidecar.istio.io/inject=true"},
		},
		{
			name: "label false beats annotation true",
			pod:  pod(both(label("sidecar.istio.io/inject", "false"), annotate("sidecar.istio.io/inject", "true"))), ns: enabled,
			want: result{false, "pod label sidecar.istio.io/inject=false"},
		},
		{
			name: "invalid inject value falls back to the policy",
			pod:  pod(label("sidecar.istio.io/inject", "yes")), ns: enabled,
			want: result{true, "namespace label istio-injection=enabled"},
		},
		{
			name: "policy disabled without a request",
			pod:  pod(nil), ns: enabled, cfg: Config{Policy: PolicyDisabled},
			want: result{false, "namespace label istio-injection=enabled, but the policy is disabled and the pod does not ask"},
		},
		{
			name: "policy disabled with the annotation",
			pod:  pod(annotate("sidecar.istio.io/inject", "true")), ns: enabled, cfg: Config{Policy: PolicyDisabled},
			want: result{true, "namespace label istio-injection=enabled, pod annotation sidecar.istio.io/inject=true"},
		},
		{
			name: "host network",
			pod:  pod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), ns: enabled,
			want: result{false, "pod uses the host network"},
		},
		{
			name: "kube-system",
			pod:  pod(func(p *corev1.Pod) { p.Namespace = "kube-system" }), ns: enabled,
			want: result{false, "namespace kube-system is never injected"},
		},
		{
			name: "Canopy's namespace",
			pod:  pod(func(p *corev1.Pod) { p.Namespace = "canopy" }), ns: enabled, cfg: Config{SystemNamespace: "canopy"},
			want: result{false, "namespace canopy is Canopy's own"},
		},
		{
			name: "default system namespace",
			pod:  pod(func(p *corev1.Pod) { p.Namespace = "istio-system" }), ns: enabled,
			want: result{false, "namespace istio-system is Canopy's own"},
		},
		{
			name: "ambient pod",
			pod:  pod(both(label("istio.io/dataplane-mode", "ambient"), label("sidecar.istio.io/inject", "true"))), ns: enabled,
			want: result{false, "pod is in ambient mode (istio.io/dataplane-mode=ambient)"},
		},
		{
			name: "pod in an ambient namespace",
			pod:  pod(label("sidecar.istio.io/inject", "true")), ns: map[string]string{"istio-injection": "enabled", "istio.io/dataplane-mode": "ambient"},
			want: result{false, "namespace is in ambient mode (istio.io/dataplane-mode=ambient)"},
		},
		{
			name: "pod opted out of an ambient namespace",
			pod:  pod(label("istio.io/dataplane-mode", "none")), ns: map[string]string{"istio-injection": "enabled", "istio.io/dataplane-mode": "ambient"},
			want: result{true, "namespace label istio-injection=enabled"},
		},
		{
			name: "neverInjectSelector refuses a pod that does not ask",
			pod:  pod(label("app", "batch")), ns: enabled, cfg: Config{NeverInjectSelector: batch, AlwaysInjectSelector: batch},
			want: result{false, "namespace label istio-injection=enabled, but the pod matches neverInjectSelector app=batch"},
		},
		{
			name: "neverInjectSelector does not beat a pod that asks",
			pod:  pod(both(label("app", "batch"), annotate("sidecar.istio.io/inject", "true"))), ns: enabled, cfg: Config{NeverInjectSelector: batch},
			want: result{true, "namespace label istio-injection=enabled, pod annotation sidecar.istio.io/inject=true"},
		},
		{
			name: "alwaysInjectSelector beats the disabled policy",
			pod:  pod(label("app", "batch")), ns: enabled, cfg: Config{Policy: PolicyDisabled, AlwaysInjectSelector: batch},
			want: result{true, "namespace label istio-injection=enabled, pod matches alwaysInjectSelector app=batch"},
		},
		{
			name: "alwaysInjectSelector does not beat a pod that refuses",
			pod:  pod(both(label("app", "batch"), label("sidecar.istio.io/inject", "false"))), ns: enabled, cfg: Config{AlwaysInjectSelector: batch},
			want: result{false, "pod label sidecar.istio.io/inject=false"},
		},
		{
			name: "alwaysInjectSelector does not select a revision",
			pod:  pod(label("app", "batch")), cfg: Config{AlwaysInjectSelector: batch},
			want: result{false, "neither the namespace nor the pod selects a revision"},
		},
		{
			name: "empty selectors match nothing",
			pod:  pod(label("app", "batch")), ns: enabled, cfg: Config{Policy: PolicyDisabled, AlwaysInjectSelector: []metav1.LabelSelector{{}}},
			want: result{false, "namespace label istio-injection=enabled, but the policy is disabled and the pod does not ask"},
		},
		{
			name: "already injected",
			pod:  pod(annotate("sidecar.istio.io/status", "{}")), ns: enabled,
			want: result{false, "pod is already injected (sidecar.istio.io/status)"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got result
			got.Inject, got.Reason = Required(tt.pod, tt.ns, tt.cfg)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Required() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
