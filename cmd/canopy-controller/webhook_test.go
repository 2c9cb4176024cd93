package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/record"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/deploy/charts"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// startWebhook runs the CA and the webhooks (injection, validation) as run
// wires them, on a free loopback port with a serving certificate for
// "localhost" from the CA's own root, and returns the webhooks' address
// and the CA's root bundle.
func startWebhook(t *testing.T, sys string) (addr string, roots []byte) {
	t.Helper()
	addr = freeAddr(t)
	cfg, err := parseFlags([]string{"--secure-addr=" + freeAddr(t), "--webhook-addr=" + addr, "--ca-namespace=" + sys,
		"--cacerts-dir=" + t.TempDir(), "--ca-dns-names=localhost", "--proxy-hub=example.test/istio", "--proxy-tag=1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clients := kubeinput.Clients{Kube: env.Client}
	if clients.Istio, err = istioclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if clients.Gateway, err = gatewayclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	tables := index.New(cfg.mesh)
	watcher := kubeinput.New(clients, tables, nil, log)
	// The writers keep the caBundle; run leads from the start, as a
	// single replica does.
	w := &writers{kube: env.Client, istio: clients.Istio, tables: tables, synced: watcher.Synced(), recorder: &record.FakeRecorder{}, log: log,
		revision: cfg.inject.Revision, patchWebhooks: true, patchValidation: cfg.validation, namespace: sys, problemInterval: time.Hour}
	ca, err := newCA(t.Context(), cfg, env.Client, authn.Reviewer{Client: env.Client.AuthenticationV1()},
		indexPods{tables: tables, synced: watcher.Synced()}, nil, nil, w.SetBundle, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	w.SetBundle(ca.rootBundle)
	hook, err := newWebhook(cfg, ca, indexNamespaces{tables: tables, synced: watcher.Synced(), client: env.Client}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	ca.start(gctx, g)
	hook.start(gctx, g)
	g.Go(func() error { return w.run(gctx) })
	g.Go(func() error { return watcher.Run(gctx) })
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("controller parts: %v", err)
		}
	})
	return addr, ca.rootBundle
}

// chartInjector renders the chart into namespace sys and returns its
// MutatingWebhookConfiguration, pointed at url instead of the Service and
// narrowed to the namespaces given, so that it cannot reach other tests'
// pods.
func chartInjector(t *testing.T, sys, url string, namespaces ...string) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	r, err := chart.Render(charts.Canopy(), chart.Options{Namespace: sys})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.Objects {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		var c admissionregistrationv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &c); err != nil {
			t.Fatal(err)
		}
		c.Name += "-" + rand.String(5)
		for i := range c.Webhooks {
			wh := &c.Webhooks[i]
			if len(wh.ClientConfig.CABundle) != 0 {
				t.Errorf("the chart sets a caBundle on %s", wh.Name)
			}
			wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
			wh.NamespaceSelector.MatchExpressions = append(wh.NamespaceSelector.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: namespaces,
			})
		}
		return &c
	}
	t.Fatal("the chart renders no MutatingWebhookConfiguration")
	return nil
}

func testPod(name string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.test/app:1"}}},
	}
}

func injected(p *corev1.Pod) bool {
	if _, ok := p.Annotations["sidecar.istio.io/status"]; !ok {
		return false
	}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name == "istio-proxy" {
			return true
		}
	}
	return false
}

// TestInjectionThroughAPIServer registers the chart's webhooks with the API
// server, pointed at the controller's webhook on loopback with an empty
// caBundle, and creates pods through the API server: the controller fills
// the caBundle with its root, and the API server calls the webhook over
// TLS verified against it and stores the injected pod; pods the selectors
// or Required leave out are stored as they were sent, and a pod with a
// refused annotation is turned away with the injector's message.
func TestInjectionThroughAPIServer(t *testing.T) {
	testenv.Need(t, env)
	sys := env.Namespace(t, "canopy", map[string]string{"istio-injection": "enabled"})
	injectNS := env.Namespace(t, "inject", map[string]string{"istio-injection": "enabled"})
	ambientNS := env.Namespace(t, "ambient", map[string]string{"istio-injection": "enabled", "istio.io/dataplane-mode": "ambient"})
	plainNS := env.Namespace(t, "plain", nil)
	addr, roots := startWebhook(t, sys)
	port := addr[strings.LastIndex(addr, ":")+1:]

	cfg := chartInjector(t, sys, "https://localhost:"+port+"/inject", sys, injectNS, ambientNS, plainNS)
	whc := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := whc.Create(t.Context(), cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := whc.Delete(ctx, cfg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", cfg.Name, err)
		}
	})
	eventually.Within(t, settle, "the controller's root in every webhook's caBundle", func() bool {
		got, err := whc.Get(t.Context(), cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, wh := range got.Webhooks {
			if !bytes.Equal(wh.ClientConfig.CABundle, roots) {
				return false
			}
		}
		return true
	})
	// The API server picks up webhook configurations from a watch of its
	// own: dry runs (the webhooks have no side effects, so they are
	// called) until one comes back injected.
	n := 0
	eventually.Within(t, settle, "a dry-run pod injected", func() bool {
		n++
		p, err := env.Client.CoreV1().Pods(injectNS).Create(t.Context(), testPod(fmt.Sprintf("probe-%d", n), nil, nil),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Logf("dry run: %v", err)
			return false
		}
		return injected(p)
	})

	for _, tt := range []struct {
		name, namespace     string
		labels, annotations map[string]string
		wantInjected        bool
		wantDenied          string
	}{
		{name: "app", namespace: injectNS, wantInjected: true},
		{name: "opted-in", namespace: plainNS, labels: map[string]string{"sidecar.istio.io/inject": "true"}, wantInjected: true},
		{name: "label-false", namespace: injectNS, labels: map[string]string{"sidecar.istio.io/inject": "false"}},
		{name: "annotation-false", namespace: injectNS, annotations: map[string]string{"sidecar.istio.io/inject": "false"}},
		{name: "ambient", namespace: ambientNS},
		{name: "plain", namespace: plainNS},
		{name: "release-namespace", namespace: sys},
		{name: "user-volume", namespace: injectNS, annotations: map[string]string{"sidecar.istio.io/userVolume": `{"extra":{"emptyDir":{}}}`},
			wantDenied: "sidecar.istio.io/userVolume"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := env.Client.CoreV1().Pods(tt.namespace).Create(t.Context(), testPod(tt.name, tt.labels, tt.annotations), metav1.CreateOptions{})
			if tt.wantDenied != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantDenied) {
					t.Fatalf("create: %v, want a denial naming %s", err, tt.wantDenied)
				}
				return
			}
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			stored, err := env.Client.CoreV1().Pods(tt.namespace).Get(t.Context(), tt.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := injected(stored); got != tt.wantInjected {
				t.Errorf("stored pod injected: %v, want %v (annotations %v, containers %d, init containers %d)",
					got, tt.wantInjected, stored.Annotations, len(stored.Spec.Containers), len(stored.Spec.InitContainers))
			}
			if tt.wantInjected {
				var names []string
				for _, c := range append(stored.Spec.InitContainers, stored.Spec.Containers...) {
					names = append(names, c.Name+"="+c.Image)
				}
				if want := "istio-proxy=example.test/istio/proxyv2:1.0.0"; !strings.Contains(strings.Join(names, " "), want) {
					t.Errorf("containers %v, want %s", names, want)
				}
			}
		})
	}
}
