package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/canopy-mesh/canopy/deploy/charts"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// chartValidators renders the chart into namespace sys and returns its
// ValidatingWebhookConfigurations, renamed apart, pointed at url instead
// of the Service and narrowed to the namespaces given, so that they
// cannot refuse other tests' objects.
func chartValidators(t *testing.T, sys, url string, namespaces ...string) []*admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	r, err := chart.Render(charts.Canopy(), chart.Options{Namespace: sys})
	if err != nil {
		t.Fatal(err)
	}
	var out []*admissionregistrationv1.ValidatingWebhookConfiguration
	for _, o := range r.Objects {
		if o.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		var c admissionregistrationv1.ValidatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &c); err != nil {
			t.Fatal(err)
		}
		c.Name += "-" + rand.String(5)
		for i := range c.Webhooks {
			wh := &c.Webhooks[i]
			if len(wh.ClientConfig.CABundle) != 0 || wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("the chart installs %s with a caBundle or failing closed", wh.Name)
			}
			wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
			wh.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: namespaces,
			}}}
		}
		out = append(out, &c)
	}
	if len(out) != 2 {
		t.Fatalf("the chart renders %d ValidatingWebhookConfigurations, want the revision's and the default one", len(out))
	}
	return out
}

func virtualService(ns, name, uriRegex string, labels map[string]string) *networkingv1.VirtualService {
	return &networkingv1.VirtualService{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: networkingapi.VirtualService{Hosts: []string{name}, Http: []*networkingapi.HTTPRoute{{
			Match: []*networkingapi.HTTPMatchRequest{{Uri: &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: uriRegex}}}},
			Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: name}}},
		}}},
	}
}

// TestValidationThroughAPIServer is the attack of finding 4 at the API
// server: the chart's validating webhook configurations are registered,
// failing open and without a caBundle, pointed at the controller's
// webhook on loopback. The controller fills in the caBundle, sees its
// webhook refuse the always-reject probe and closes them; then the
// VirtualService with the URI regex "(" in namespace attacker is refused
// with Istio's message, labelled for the revision or not, and a good one
// in another namespace is stored.
func TestValidationThroughAPIServer(t *testing.T) {
	testenv.Need(t, env)
	sys := env.Namespace(t, "canopy", nil)
	attacker := env.Namespace(t, "attacker", nil)
	prod := env.Namespace(t, "prod", nil)
	addr, roots := startWebhook(t, sys)
	port := addr[strings.LastIndex(addr, ":")+1:]

	vwc := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cfgs := chartValidators(t, sys, "https://localhost:"+port+"/validate", sys, attacker, prod)
	for _, c := range cfgs {
		if _, err := vwc.Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := vwc.Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", c.Name, err)
			}
		})
	}
	eventually.Within(t, settle, "the controller's root in every validating webhook and failurePolicy Fail", func() bool {
		for _, c := range cfgs {
			got, err := vwc.Get(t.Context(), c.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, wh := range got.Webhooks {
				if !bytes.Equal(wh.ClientConfig.CABundle, roots) || wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail {
					return false
				}
			}
		}
		return true
	})

	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vss := func(ns string) interface {
		Create(context.Context, *networkingv1.VirtualService, metav1.CreateOptions) (*networkingv1.VirtualService, error)
	} {
		return istio.NetworkingV1().VirtualServices(ns)
	}
	const refused = `denied the request: configuration is invalid: "uri": error parsing regexp: missing closing ): ` + "`(`" +
		`; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)`
	for _, tt := range []struct {
		name, namespace, regex string
		labels                 map[string]string
		wantWebhook            string // "" for stored
	}{
		{name: "ratings", namespace: attacker, regex: "(", wantWebhook: "validation.istio.io"},
		{name: "ratings-rev", namespace: attacker, regex: "(", labels: map[string]string{"istio.io/rev": "default"}, wantWebhook: "validation.istio.io"},
		{name: "reviews", namespace: prod, regex: "^/api/v[0-9]+/.*$"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := vss(tt.namespace).Create(t.Context(), virtualService(tt.namespace, tt.name, tt.regex, tt.labels), metav1.CreateOptions{})
			if tt.wantWebhook == "" {
				if err != nil {
					t.Fatalf("a good VirtualService was refused: %v", err)
				}
				return
			}
			// Either webhook may answer first: both end in the webhook name.
			if err == nil || !strings.Contains(err.Error(), tt.wantWebhook+`" `+refused) {
				t.Fatalf("create: %v, want a denial by %s: %s", err, tt.wantWebhook, refused)
			}
			t.Logf("refused: %v", err)
			if _, err := istio.NetworkingV1().VirtualServices(tt.namespace).Get(t.Context(), tt.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the refused VirtualService is stored: %v", err)
			}
		})
	}
	// A DestinationRule of a host Istio refuses, too.
	_, err = istio.NetworkingV1().DestinationRules(attacker).Create(t.Context(), &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "wild"},
		Spec:       networkingapi.DestinationRule{Host: "a*b.example.com"},
	}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), `configuration is invalid: domain name "a*b.example.com" invalid (label "a*b" invalid)`) {
		t.Errorf("create DestinationRule a*b.example.com: %v, want Istio's refusal", err)
	}
}
