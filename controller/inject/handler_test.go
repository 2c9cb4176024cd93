package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// fakeNamespaces knows the namespaces in the map.
type fakeNamespaces map[string]map[string]string

func (f fakeNamespaces) NamespaceLabels(_ context.Context, name string) (map[string]string, bool) {
	l, ok := f[name]
	return l, ok
}

func testHandler(t testing.TB) *Handler {
	t.Helper()
	h, err := NewHandler(testConfig(), fakeNamespaces{
		"demo":  {"istio-injection": "enabled"},
		"plain": nil,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func reviewBody(t testing.TB, mod func(*admissionv1.AdmissionReview)) []byte {
	t.Helper()
	pod, err := json.Marshal(testPod())
	if err != nil {
		t.Fatal(err)
	}
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "7f0b2f4e-1",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "demo",
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: pod},
		},
	}
	if mod != nil {
		mod(&r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func withPod(mod func(*corev1.Pod)) func(*admissionv1.AdmissionReview) {
	return func(r *admissionv1.AdmissionReview) {
		pod := testPod()
		mod(pod)
		b, _ := json.Marshal(pod)
		r.Request.Object.Raw = b
	}
}

func TestHandler(t *testing.T) {
	t.Parallel()
	type outcome struct {
		Code    int
		Allowed bool
		Patched bool
		Message string // a substring of the denial or error text
	}
	for _, tt := range []struct {
		name        string
		method      string
		path        string
		contentType string
		body        []byte
		want        outcome
	}{
		{name: "injects", body: reviewBody(t, nil), want: outcome{Code: 200, Allowed: true, Patched: true}},
		{name: "trailing slash", path: "/inject/", body: reviewBody(t, nil), want: outcome{Code: 200, Allowed: true, Patched: true}},
		{name: "content type with charset", contentType: "application/json; charset=utf-8", body: reviewBody(t, nil), want: outcome{Code: 200, Allowed: true, Patched: true}},
		{name: "not selected", body: reviewBody(t, func(r *admissionv1.AdmissionReview) {
			r.Request.Namespace = "plain"
			withPod(func(p *corev1.Pod) { p.Namespace = "plain" })(r)
		}), want: outcome{Code: 200, Allowed: true}},
		{name: "namespace from the request", body: reviewBody(t, withPod(func(p *corev1.Pod) { p.Namespace = "" })), want: outcome{Code: 200, Allowed: true, Patched: true}},
		{name: "unknown namespace", body: reviewBody(t, func(r *admissionv1.AdmissionReview) {
			r.Request.Namespace = "new"
			withPod(func(p *corev1.Pod) { p.Namespace = "" })(r)
		}), want: outcome{Code: 200, Message: `namespace "new" is not known`}},
		{name: "refused annotation", body: reviewBody(t, withPod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{"sidecar.istio.io/userVolume": "{}"}
		})), want: outcome{Code: 200, Message: "sidecar.istio.io/userVolume"}},
		{name: "unknown template", body: reviewBody(t, withPod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationTemplates: "gateway"}
		})), want: outcome{Code: 200, Message: `unknown injection template "gateway"`}},
		{name: "already injected", body: reviewBody(t, withPod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationStatus: "{}"}
		})), want: outcome{Code: 200, Allowed: true}},
		{name: "update is left alone", body: reviewBody(t, func(r *admissionv1.AdmissionReview) { r.Request.Operation = admissionv1.Update }), want: outcome{Code: 200, Allowed: true}},
		{name: "not a pod", body: reviewBody(t, func(r *admissionv1.AdmissionReview) {
			r.Request.Kind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
		}), want: outcome{Code: 200, Message: "pods only"}},
		{name: "object is not a pod", body: reviewBody(t, func(r *admissionv1.AdmissionReview) {
			r.Request.Object.Raw = []byte(`{"spec":{"containers":"nope"}}`)
		}), want: outcome{Code: 200, Message: "decode pod"}},
		{name: "GET", method: http.MethodGet, want: outcome{Code: 405, Message: "use POST"}},
		{name: "other path", path: "/inject/cluster/c1/net/n1", body: reviewBody(t, nil), want: outcome{Code: 404}},
		{name: "text body", contentType: "text/plain", body: reviewBody(t, nil), want: outcome{Code: 415, Message: "application/json"}},
		{name: "no content type", contentType: "-", body: reviewBody(t, nil), want: outcome{Code: 415, Message: "application/json"}},
		{name: "empty body", body: nil, want: outcome{Code: 400, Message: "empty request body"}},
		{name: "not JSON", body: []byte("{"), want: outcome{Code: 400, Message: "decode admission review"}},
		{name: "v1beta1 review", body: reviewBody(t, func(r *admissionv1.AdmissionReview) { r.APIVersion = "admission.k8s.io/v1beta1" }), want: outcome{Code: 400, Message: "want an AdmissionReview"}},
		{name: "no request", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), want: outcome{Code: 400, Message: "no request"}},
		{name: "no uid", body: reviewBody(t, func(r *admissionv1.AdmissionReview) { r.Request.UID = "" }), want: outcome{Code: 400, Message: "no uid"}},
		{name: "too large", body: bytes.Repeat([]byte(" "), MaxRequestBytes+1), want: outcome{Code: 413, Message: "larger than"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			method, path, ct := tt.method, tt.path, tt.contentType
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/inject"
			}
			req := httptest.NewRequest(method, path, bytes.NewReader(tt.body))
			switch ct {
			case "":
				req.Header.Set("Content-Type", "application/json")
			case "-":
			default:
				req.Header.Set("Content-Type", ct)
			}
			rec := httptest.NewRecorder()
			testHandler(t).ServeHTTP(rec, req)

			got := outcome{Code: rec.Code}
			text := rec.Body.String()
			if rec.Code == http.StatusOK {
				var review admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil {
					t.Fatalf("decode response: %v", err)
				}
				if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Response == nil {
					t.Fatalf("response is not an AdmissionReview v1: %s", text)
				}
				if review.Response.UID != "7f0b2f4e-1" {
					t.Errorf("response uid = %q", review.Response.UID)
				}
				got.Allowed = review.Response.Allowed
				got.Patched = review.Response.Patch != nil
				if got.Patched && (review.Response.PatchType == nil || *review.Response.PatchType != admissionv1.PatchTypeJSONPatch) {
					t.Errorf("patch type = %v, want JSONPatch", review.Response.PatchType)
				}
				text = ""
				if r := review.Response.Result; r != nil {
					text = r.Message
				}
			}
			if tt.want.Message != "" && strings.Contains(text, tt.want.Message) {
				got.Message = tt.want.Message
			} else if tt.want.Message != "" {
				got.Message = text
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewHandler(t *testing.T) {
	t.Parallel()
	if _, err := NewHandler(Config{}, fakeNamespaces{}, nil); err == nil || !strings.Contains(err.Error(), "hub is empty") {
		t.Errorf("NewHandler(empty config) error = %v", err)
	}
	if _, err := NewHandler(testConfig(), nil, nil); err == nil {
		t.Error("NewHandler(nil namespaces) succeeded")
	}
	if _, err := NewHandler(testConfig(), fakeNamespaces{}, nil); err != nil {
		t.Errorf("NewHandler(nil logger) error = %v", err)
	}
}

// FuzzHandler feeds arbitrary bodies to the webhook. Whatever comes in,
// the answer is a clean HTTP error or an AdmissionReview for the request's
// uid, and a patch, when there is one, applies to the request's object.
func FuzzHandler(f *testing.F) {
	f.Add(reviewBody(f, nil))
	f.Add(reviewBody(f, withPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent, AnnotationProxyConfig: "concurrency: 2"}
	})))
	f.Add(reviewBody(f, withPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationStatusPort: "0", AnnotationExcludeInboundPorts: "1,2"}
	})))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"demo","object":{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a"}]}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"demo","object":null}}`))
	f.Add([]byte(`[]`))
	h := testHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/inject", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		var in, out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("accepted a body that does not decode: %v", err)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("response is not an AdmissionReview: %v: %s", err, rec.Body)
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("response uid %q, request uid %q", out.Response.UID, in.Request.UID)
		}
		if out.Response.Patch == nil {
			return
		}
		if !out.Response.Allowed {
			t.Fatal("denied with a patch")
		}
		var pod corev1.Pod
		if err := json.Unmarshal(in.Request.Object.Raw, &pod); err != nil {
			t.Fatalf("patched an object that is not a pod: %v", err)
		}
		pod.ManagedFields = nil
		doc, err := json.Marshal(&pod)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			t.Fatalf("decode patch: %v", err)
		}
		if _, err := p.Apply(doc); err != nil {
			t.Fatalf("patch does not apply: %v\n%s", err, out.Response.Patch)
		}
	})
}

// TestHandlerDenyReason: without an image, pods that would be injected are
// denied with the reason and other pods are left alone.
func TestHandlerDenyReason(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Hub, cfg.Tag, cfg.DenyReason = "", "", "no proxy image configured"
	h, err := NewHandler(cfg, fakeNamespaces{"demo": {"istio-injection": "enabled"}, "plain": nil}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		mod     func(*admissionv1.AdmissionReview)
		allowed bool
	}{
		{"selected pod is denied", nil, false},
		{"other pod passes", func(r *admissionv1.AdmissionReview) {
			r.Request.Namespace = "plain"
			withPod(func(p *corev1.Pod) { p.Namespace = "plain" })(r)
		}, true},
	} {
		req := httptest.NewRequest(http.MethodPost, "/inject", bytes.NewReader(reviewBody(t, tt.mod)))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil || review.Response == nil {
			t.Fatalf("%s: not an AdmissionReview (%v): %s", tt.name, err, rec.Body)
		}
		if got := review.Response.Allowed; got != tt.allowed {
			t.Errorf("%s: allowed = %v, want %v", tt.name, got, tt.allowed)
		}
		if !tt.allowed && (review.Response.Result == nil || !strings.Contains(review.Response.Result.Message, "no proxy image configured")) {
			t.Errorf("%s: denial = %+v, want the reason", tt.name, review.Response.Result)
		}
		if review.Response.Patch != nil {
			t.Errorf("%s: patched", tt.name)
		}
	}
	if _, err := Mutate(testPod(), cfg); err == nil {
		t.Error("Mutate without an image succeeded")
	}
}
