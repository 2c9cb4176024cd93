package webhookpatch

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func config(rev string, webhooks map[string]string) *admissionregistrationv1.MutatingWebhookConfiguration {
	c := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-sidecar-injector", ResourceVersion: "42"},
	}
	if rev != "" {
		c.Labels = map[string]string{LabelRevision: rev}
	}
	for _, name := range []string{"rev.namespace.sidecar-injector.istio.io", "rev.object.sidecar-injector.istio.io", "other.example.com"} {
		if b, ok := webhooks[name]; ok {
			wh := admissionregistrationv1.MutatingWebhook{Name: name}
			if b != "" {
				wh.ClientConfig.CABundle = []byte(b)
			}
			c.Webhooks = append(c.Webhooks, wh)
		}
	}
	return c
}

// bundles applies the plan to cfg and returns each webhook's caBundle.
func bundles(t *testing.T, cfg *admissionregistrationv1.MutatingWebhookConfiguration, patch []byte) map[string]string {
	t.Helper()
	doc, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if patch != nil {
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatalf("decode patch %s: %v", patch, err)
		}
		if doc, err = p.Apply(doc); err != nil {
			t.Fatalf("apply patch %s: %v", patch, err)
		}
	}
	var out admissionregistrationv1.MutatingWebhookConfiguration
	if err := json.Unmarshal(doc, &out); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, wh := range out.Webhooks {
		got[wh.Name] = string(wh.ClientConfig.CABundle)
	}
	return got
}

func TestPlan(t *testing.T) {
	t.Parallel()
	const root = "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"
	for _, tt := range []struct {
		name      string
		cfg       *admissionregistrationv1.MutatingWebhookConfiguration
		revision  string
		wantPatch bool
		want      map[string]string
	}{
		{
			name: "fills empty bundles, leaves other webhooks", revision: "",
			cfg:       config("default", map[string]string{"rev.namespace.sidecar-injector.istio.io": "", "rev.object.sidecar-injector.istio.io": "", "other.example.com": "theirs"}),
			wantPatch: true,
			want:      map[string]string{"rev.namespace.sidecar-injector.istio.io": root, "rev.object.sidecar-injector.istio.io": root, "other.example.com": "theirs"},
		},
		{
			name: "replaces a stale bundle only where stale", revision: "canary",
			cfg:       config("canary", map[string]string{"rev.namespace.sidecar-injector.istio.io": "old", "rev.object.sidecar-injector.istio.io": root}),
			wantPatch: true,
			want:      map[string]string{"rev.namespace.sidecar-injector.istio.io": root, "rev.object.sidecar-injector.istio.io": root},
		},
		{
			name: "equal: no write", revision: "default",
			cfg: config("default", map[string]string{"rev.namespace.sidecar-injector.istio.io": root, "other.example.com": ""}),
		},
		{
			name: "another revision", revision: "default",
			cfg: config("canary", map[string]string{"rev.namespace.sidecar-injector.istio.io": ""}),
		},
		{
			name: "no revision label", revision: "default",
			cfg: config("", map[string]string{"rev.namespace.sidecar-injector.istio.io": ""}),
		},
		{
			name: "no injector webhook", revision: "default",
			cfg: config("default", map[string]string{"other.example.com": ""}),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			before := tt.cfg.DeepCopy()
			patch, err := Plan(tt.cfg, tt.revision, []byte(root))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, tt.cfg); diff != "" {
				t.Errorf("Plan modified its input:\n%s", diff)
			}
			if (patch != nil) != tt.wantPatch {
				t.Fatalf("Plan() = %s, want a patch: %v", patch, tt.wantPatch)
			}
			if !tt.wantPatch {
				return
			}
			if diff := cmp.Diff(tt.want, bundles(t, tt.cfg, patch)); diff != "" {
				t.Errorf("caBundles after the patch (-want +got):\n%s", diff)
			}
			// Planning again from the patched configuration: nothing.
			patched := tt.cfg.DeepCopy()
			for i := range patched.Webhooks {
				patched.Webhooks[i].ClientConfig.CABundle = []byte(tt.want[patched.Webhooks[i].Name])
			}
			if again, _ := Plan(patched, tt.revision, []byte(root)); again != nil {
				t.Errorf("Plan of the patched configuration = %s, want none", again)
			}
			// A configuration changed since it was read is not patched.
			moved := tt.cfg.DeepCopy()
			moved.ResourceVersion = "43"
			doc, _ := json.Marshal(moved)
			p, _ := jsonpatch.DecodePatch(patch)
			if _, err := p.Apply(doc); err == nil {
				t.Error("the patch applied to a newer resourceVersion")
			}
		})
	}
}

// TestPlanValidating: the validator's webhooks of the revision get the
// bundle, and failurePolicy Fail only once the webhook answers; another
// webhook of the configuration, another revision's configuration and an
// equal one get nothing.
func TestPlanValidating(t *testing.T) {
	t.Parallel()
	ignore, fail := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	cfg := func(rev string, bundle string, policy admissionregistrationv1.FailurePolicyType) *admissionregistrationv1.ValidatingWebhookConfiguration {
		c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{
			Name: "istio-validator-istio-system", ResourceVersion: "7", Labels: map[string]string{LabelRevision: rev}}}
		for _, name := range []string{"rev.validation.istio.io", "audit.example.com"} {
			wh := admissionregistrationv1.ValidatingWebhook{Name: name, FailurePolicy: &policy}
			wh.ClientConfig.CABundle = []byte(bundle)
			c.Webhooks = append(c.Webhooks, wh)
		}
		return c
	}
	type state struct{ Bundle, Policy string }
	apply := func(t *testing.T, c *admissionregistrationv1.ValidatingWebhookConfiguration, patch []byte) map[string]state {
		t.Helper()
		doc, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if patch != nil {
			p, err := jsonpatch.DecodePatch(patch)
			if err != nil {
				t.Fatal(err)
			}
			if doc, err = p.Apply(doc); err != nil {
				t.Fatalf("apply %s: %v", patch, err)
			}
		}
		var out admissionregistrationv1.ValidatingWebhookConfiguration
		if err := json.Unmarshal(doc, &out); err != nil {
			t.Fatal(err)
		}
		got := map[string]state{}
		for _, wh := range out.Webhooks {
			got[wh.Name] = state{string(wh.ClientConfig.CABundle), string(*wh.FailurePolicy)}
		}
		return got
	}
	for _, tt := range []struct {
		name       string
		cfg        *admissionregistrationv1.ValidatingWebhookConfiguration
		failClosed bool
		wantNil    bool
		want       state // of rev.validation.istio.io
	}{
		{name: "bundle only while not answering", cfg: cfg("default", "", ignore), want: state{"root", "Ignore"}},
		{name: "bundle and Fail once answering", cfg: cfg("default", "", ignore), failClosed: true, want: state{"root", "Fail"}},
		{name: "Fail alone", cfg: cfg("default", "root", ignore), failClosed: true, want: state{"root", "Fail"}},
		{name: "nothing to do", cfg: cfg("default", "root", fail), failClosed: true, wantNil: true},
		{name: "another revision", cfg: cfg("canary", "", ignore), failClosed: true, wantNil: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			patch, err := PlanValidating(tt.cfg, "", []byte("root"), tt.failClosed)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantNil != (patch == nil) {
				t.Fatalf("patch %s, want nil: %v", patch, tt.wantNil)
			}
			got := apply(t, tt.cfg, patch)
			if !tt.wantNil {
				if diff := cmp.Diff(tt.want, got["rev.validation.istio.io"]); diff != "" {
					t.Errorf("rev.validation.istio.io (-want +got):\n%s", diff)
				}
			}
			if other := got["audit.example.com"]; other.Bundle != string(tt.cfg.Webhooks[1].ClientConfig.CABundle) || other.Policy != string(*tt.cfg.Webhooks[1].FailurePolicy) {
				t.Errorf("another webhook of the configuration changed: %+v", other)
			}
		})
	}
}
