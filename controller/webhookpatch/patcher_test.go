package webhookpatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const settle = 30 * time.Second

// inertWebhook is a webhook the API server never calls: its object
// selector matches no object, and a failure would be ignored anyway, so
// the configurations these tests create disturb no other test.
func inertWebhook(name string, bundle []byte) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: name,
		ClientConfig: admissionregistrationv1.WebhookClientConfig{
			URL:      ptr.To("https://127.0.0.1:1/inject"),
			CABundle: bundle,
		},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}},
		ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"canopy.test/never": "matched"}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

func createConfig(t *testing.T, name, rev string, webhooks ...admissionregistrationv1.MutatingWebhook) {
	t.Helper()
	c := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelRevision: rev}},
		Webhooks:   webhooks,
	}
	if _, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", name, err)
		}
	})
}

// caBundles returns the caBundle of each webhook of the configuration.
func caBundles(t *testing.T, name string) map[string]string {
	t.Helper()
	c, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, wh := range c.Webhooks {
		out[wh.Name] = string(wh.ClientConfig.CABundle)
	}
	return out
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPatcherKeepsCABundle runs the patcher against the API server: it
// fills the injector webhooks of its revision, leaves another webhook of
// the same configuration and another revision's configuration alone, puts
// a reset bundle back, and follows a new bundle.
func TestPatcherKeepsCABundle(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	suffix := rand.String(5)
	rev, otherRev := "rev-"+suffix, "other-"+suffix
	mine, theirs := "istio-sidecar-injector-"+rev, "istio-sidecar-injector-"+otherRev
	const foreign = "-----BEGIN CERTIFICATE-----\nforeign\n-----END CERTIFICATE-----\n"
	createConfig(t, mine, rev,
		inertWebhook("rev.namespace.sidecar-injector.istio.io", nil),
		inertWebhook("rev.object.sidecar-injector.istio.io", []byte("stale")),
		inertWebhook("audit.example.com", []byte(foreign)))
	createConfig(t, theirs, otherRev, inertWebhook("rev.namespace.sidecar-injector.istio.io", nil))

	rootA := []byte("-----BEGIN CERTIFICATE-----\nroot A\n-----END CERTIFICATE-----\n")
	rootB := []byte("-----BEGIN CERTIFICATE-----\nroot B\n-----END CERTIFICATE-----\n")
	p, err := New(env.Client, rev, rootA, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	want := func(root []byte) map[string]string {
		return map[string]string{
			"rev.namespace.sidecar-injector.istio.io": string(root),
			"rev.object.sidecar-injector.istio.io":    string(root),
			"audit.example.com":                       foreign,
		}
	}
	eventually.Within(t, settle, "the injector webhooks carrying root A", func() bool { return equal(caBundles(t, mine), want(rootA)) })

	// Someone resets one bundle: it comes back.
	c, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), mine, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(t.Context(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the reset caBundle restored", func() bool { return equal(caBundles(t, mine), want(rootA)) })

	// The roots change: the bundles follow.
	p.SetBundle(rootB)
	eventually.Within(t, settle, "the injector webhooks carrying root B", func() bool { return equal(caBundles(t, mine), want(rootB)) })

	// Once equal, nothing is written: syncing the configuration again, as
	// the informer holds it now, leaves its resourceVersion as it is.
	before, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), mine, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the informer at the current version", func() bool {
		c, err := p.configs.Get(mine)
		return err == nil && c.ResourceVersion == before.ResourceVersion
	})
	if err := p.sync(t.Context(), mine); err != nil {
		t.Fatalf("sync of an equal configuration: %v", err)
	}
	after, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), mine, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if before.ResourceVersion != after.ResourceVersion {
		t.Errorf("an equal bundle was written again: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}

	// The other revision's configuration was never touched.
	if got := caBundles(t, theirs); got["rev.namespace.sidecar-injector.istio.io"] != "" {
		t.Errorf("another revision's webhook got a caBundle: %q", got)
	}
}

// TestPatcherClosesValidation runs the patcher with validation against the
// API server: the validator's webhook of its revision gets the bundle at
// once and stays failing open while the webhook does not answer its
// probe, then fails closed; another webhook of the configuration is left
// alone.
func TestPatcherClosesValidation(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	rev := "val-" + rand.String(5)
	name := "istio-validator-" + rev
	inert := func(name string) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name:         name,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/validate")},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"networking.istio.io"}, APIVersions: []string{"*"}, Resources: []string{"*"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"canopy.test/never": "matched"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}
	}
	vwc := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := vwc.Create(t.Context(), &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelRevision: rev}},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{inert("rev.validation.istio.io"), inert("audit.example.com")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := vwc.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", name, err)
		}
	})
	var answering atomic.Bool
	var probes atomic.Int32
	ready := func(context.Context) error {
		probes.Add(1)
		if !answering.Load() {
			return errors.New("not yet")
		}
		return nil
	}
	root := []byte("-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n")
	p, err := New(env.Client, rev, root, slog.New(slog.NewTextHandler(io.Discard, nil)), WithValidation(ready))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	state := func() map[string]string {
		c, err := vwc.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, wh := range c.Webhooks {
			out[wh.Name] = string(*wh.FailurePolicy) + " " + string(wh.ClientConfig.CABundle)
		}
		return out
	}
	open := map[string]string{"rev.validation.istio.io": "Ignore " + string(root), "audit.example.com": "Ignore "}
	eventually.Within(t, settle, "the bundle while failing open", func() bool { return equal(state(), open) })
	eventually.Within(t, settle, "the probe asked again", func() bool { return probes.Load() >= 2 })
	if got := state(); !equal(got, open) {
		t.Fatalf("closed before the webhook answered: %v", got)
	}
	answering.Store(true)
	closed := map[string]string{"rev.validation.istio.io": "Fail " + string(root), "audit.example.com": "Ignore "}
	eventually.Within(t, settle, "failing closed once the webhook answers", func() bool { return equal(state(), closed) })
}
