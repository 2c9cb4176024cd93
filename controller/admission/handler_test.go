package admission

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// outcome is what a test reads of an answer.
type outcome struct {
	HTTP     int
	Allowed  bool
	Message  string // a part of the denial's message
	Warnings []string
}

func post(t *testing.T, path string, body []byte) (int, *admissionv1.AdmissionReview) {
	t.Helper()
	h := NewHandler(slog.New(slog.NewTextHandler(io.Discard, nil)))
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, nil
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("decode answer: %v", err)
	}
	return rec.Code, &out
}

func review(t *testing.T, op admissionv1.Operation, group, kind, object string) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "uid-1", Kind: metav1.GroupVersionKind{Group: group, Version: "v1", Kind: kind},
			Namespace: "attacker", Operation: op, Object: runtime.RawExtension{Raw: []byte(object)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHandler(t *testing.T) {
	t.Parallel()
	const (
		net = "networking.istio.io"
		sec = "security.istio.io"
	)
	vs := func(regex string) string {
		return `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"ratings","namespace":"attacker"},
			"spec":{"hosts":["ratings"],"http":[{"match":[{"uri":{"regex":` + regex + `}}],"route":[{"destination":{"host":"ratings"}}]}]}}`
	}
	for _, tt := range []struct {
		name              string
		op                admissionv1.Operation
		group, kind, body string
		want              outcome
	}{
		{name: "good VirtualService", op: admissionv1.Create, group: net, kind: "VirtualService", body: vs(`"^/api/.*"`),
			want: outcome{HTTP: 200, Allowed: true}},
		{name: "the attack", op: admissionv1.Create, group: net, kind: "VirtualService", body: vs(`"("`),
			want: outcome{HTTP: 200, Message: "configuration is invalid: \"uri\": error parsing regexp: missing closing ): `(`; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"}},
		{name: "update too", op: admissionv1.Update, group: net, kind: "VirtualService", body: vs(`"("`),
			want: outcome{HTTP: 200, Message: "configuration is invalid"}},
		{name: "delete passes", op: admissionv1.Delete, group: net, kind: "VirtualService", body: vs(`"("`),
			want: outcome{HTTP: 200, Allowed: true}},
		{name: "wildcard inside a host", op: admissionv1.Create, group: net, kind: "DestinationRule",
			body: `{"metadata":{"name":"r"},"spec":{"host":"a*b.example.com"}}`,
			want: outcome{HTTP: 200, Message: `configuration is invalid: domain name "a*b.example.com" invalid (label "a*b" invalid)`}},
		{name: "ServiceEntry", op: admissionv1.Create, group: net, kind: "ServiceEntry",
			body: `{"metadata":{"name":"e"},"spec":{"hosts":["*"],"ports":[{"number":80,"name":"http","protocol":"HTTP"}]}}`,
			want: outcome{HTTP: 200, Message: "invalid host *"}},
		{name: "Sidecar", op: admissionv1.Create, group: net, kind: "Sidecar", body: `{"metadata":{"name":"s"},"spec":{}}`,
			want: outcome{HTTP: 200, Message: "sidecar: empty configuration provided"}},
		{name: "AuthorizationPolicy", op: admissionv1.Create, group: sec, kind: "AuthorizationPolicy",
			body: `{"metadata":{"name":"p"},"spec":{"action":"DENY","rules":[{"from":[{"source":{"ipBlocks":["10.0.0.0/33"]}}]}]}}`,
			want: outcome{HTTP: 200, Message: "invalid policy p.attacker: bad CIDR range (10.0.0.0/33)"}},
		{name: "PeerAuthentication", op: admissionv1.Create, group: sec, kind: "PeerAuthentication",
			body: `{"metadata":{"name":"p"},"spec":{"portLevelMtls":{"8080":{"mode":"DISABLE"}}}}`,
			want: outcome{HTTP: 200, Message: "mesh/namespace peer authentication cannot have port level mTLS"}},
		{name: "a kind Canopy does not translate", op: admissionv1.Create, group: net, kind: "Gateway",
			body: `{"metadata":{"name":"g"},"spec":{"servers":"anything"}}`, want: outcome{HTTP: 200, Allowed: true}},
		{name: "the readiness probe", op: admissionv1.Create, group: net, kind: "VirtualService",
			body: `{"metadata":{"name":"probe","annotations":{"internal.istio.io/webhook-always-reject":"true"}},"spec":{}}`,
			want: outcome{HTTP: 200, Message: `"internal.istio.io/webhook-always-reject" annotation found, rejecting`}},
		{name: "dry-run on a VirtualService", op: admissionv1.Create, group: net, kind: "VirtualService",
			body: `{"metadata":{"name":"r","annotations":{"istio.io/dry-run":"true"}},"spec":{}}`,
			want: outcome{HTTP: 200, Message: "attacker/r has unsupported annotation istio.io/dry-run"}},
		{name: "a spec that does not decode", op: admissionv1.Create, group: net, kind: "VirtualService",
			body: `{"metadata":{"name":"r"},"spec":{"hosts":"r"}}`,
			want: outcome{HTTP: 200, Message: "error decoding configuration"}},
		// CRDs newer than this build: Istio's webhook lets fields it does
		// not know through, and checks the rest.
		{name: "a field newer than this build", op: admissionv1.Create, group: net, kind: "VirtualService",
			body: `{"metadata":{"name":"r"},"spec":{"hosts":["r"],"fieldOfTomorrow":{"x":1},"http":[{"route":[{"destination":{"host":"r"}}]}]}}`,
			want: outcome{HTTP: 200, Allowed: true}},
		{name: "a newer field beside a bad regex", op: admissionv1.Create, group: net, kind: "VirtualService",
			body: `{"metadata":{"name":"r"},"spec":{"hosts":["r"],"fieldOfTomorrow":1,"http":[{"match":[{"uri":{"regex":"("}}],"route":[{"destination":{"host":"r"}}]}]}}`,
			want: outcome{HTTP: 200, Message: "configuration is invalid"}},
		// Allowed, with what sidecars will get nothing of said.
		{name: "a field Canopy does not translate", op: admissionv1.Create, group: net, kind: "Sidecar",
			body: `{"metadata":{"name":"s"},"spec":{"egress":[{"hosts":["./*"]}],"outboundTrafficPolicy":{"mode":"REGISTRY_ONLY"}}}`,
			want: outcome{HTTP: 200, Allowed: true, Warnings: []string{"Canopy does not translate for sidecars: outboundTrafficPolicy"}}},
		{name: "not Istio's", op: admissionv1.Create, group: "", kind: "Pod", body: `{}`,
			want: outcome{HTTP: 200, Message: "unrecognized type"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out := post(t, "/validate", review(t, tt.op, tt.group, tt.kind, tt.body))
			got := outcome{HTTP: code}
			if out != nil {
				got.Allowed, got.Warnings = out.Response.Allowed, out.Response.Warnings
				if out.Response.UID != "uid-1" {
					t.Errorf("answer for uid %q, want uid-1", out.Response.UID)
				}
				if r := out.Response.Result; r != nil && strings.Contains(r.Message, tt.want.Message) {
					got.Message = tt.want.Message
				} else if r != nil {
					got.Message = r.Message
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandlerRefusesWhatIsNotAReview(t *testing.T) {
	t.Parallel()
	if code, _ := post(t, "/inject", review(t, admissionv1.Create, "networking.istio.io", "VirtualService", "{}")); code != http.StatusNotFound {
		t.Errorf("/inject: HTTP %d, want 404", code)
	}
	if code, _ := post(t, "/validate", []byte(`{"kind":"Pod"}`)); code != http.StatusBadRequest {
		t.Errorf("not a review: HTTP %d, want 400", code)
	}
}
