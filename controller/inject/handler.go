package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// MaxRequestBytes bounds an AdmissionReview body. The API server caps
	// objects at about 3 MiB; anything larger is not from it.
	MaxRequestBytes = 4 << 20
	// RequestTimeout bounds reading a request and answering it. The API
	// server waits 10 s by default (at most 30 s) for a webhook.
	RequestTimeout = 10 * time.Second
)

// Namespaces gives the labels of a namespace: the AdmissionReview carries
// the pod, but Required also reads its namespace's labels. It must be safe
// for concurrent use (an informer's lister is). ctx bounds the lookup: the
// request's deadline.
type Namespaces interface {
	// NamespaceLabels returns the namespace's labels, and false when the
	// namespace is not known. The map is only read.
	NamespaceLabels(ctx context.Context, name string) (map[string]string, bool)
}

// Handler is the injection webhook: it takes AdmissionReview v1 requests
// for pods on /inject and /inject/ and answers with a JSONPatch, or a
// denial that says why. It is safe for concurrent use.
type Handler struct {
	cfg Config
	ns  Namespaces
	log *slog.Logger
}

// NewHandler returns the webhook for cfg, reading namespace labels from
// ns. log may be nil.
func NewHandler(cfg Config, ns Namespaces, log *slog.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ns == nil {
		return nil, errors.New("new injection handler: no namespace source")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, ns: ns, log: log.With("component", "inject")}, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/inject" && r.URL.Path != "/inject/" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed: use POST", http.StatusMethodNotAllowed)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "unsupported content type: want application/json", http.StatusUnsupportedMediaType)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
	defer cancel()
	// Not every ResponseWriter supports deadlines (tests' recorders
	// do not); the server's own timeouts then still apply.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(RequestTimeout))

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", MaxRequestBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	review, err := decodeReview(body)
	if err != nil {
		h.log.Debug("bad admission review", "err", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp := h.review(ctx, review.Request)
	resp.UID = review.Request.UID
	if err := ctx.Err(); err != nil {
		http.Error(w, "request deadline exceeded", http.StatusServiceUnavailable)
		return
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil {
		h.log.Error("encode admission response", "err", err)
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// decodeReview parses an AdmissionReview v1 that carries a request.
func decodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("empty request body")
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, fmt.Errorf("decode admission review: %w", err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("want an AdmissionReview of %s, got kind %q of %q",
			admissionv1.SchemeGroupVersion, review.Kind, review.APIVersion)
	}
	if review.Request == nil {
		return nil, errors.New("admission review has no request")
	}
	if review.Request.UID == "" {
		return nil, errors.New("admission request has no uid")
	}
	return &review, nil
}

// review answers one admission request.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" {
		return deny(http.StatusBadRequest, fmt.Sprintf("the sidecar injector handles pods only, not %s", req.Kind.String()))
	}
	if req.Operation != admissionv1.Create {
		// Only creation injects; Istio's webhook is registered for
		// CREATE alone.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(http.StatusBadRequest, "decode pod: "+err.Error())
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	log := h.log.With("pod", pod.Namespace+"/"+name)

	nsLabels, ok := h.ns.NamespaceLabels(ctx, pod.Namespace)
	if !ok {
		return deny(http.StatusServiceUnavailable, fmt.Sprintf("namespace %q is not known to the sidecar injector yet; retry", pod.Namespace))
	}
	if inject, reason := Required(&pod, nsLabels, h.cfg); !inject {
		log.Debug("not injecting", "reason", reason)
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if h.cfg.DenyReason != "" {
		log.Info("refused injection", "reason", h.cfg.DenyReason)
		return deny(http.StatusServiceUnavailable, "sidecar injection: "+h.cfg.DenyReason)
	}
	patch, err := Inject(&pod, h.cfg)
	if err != nil {
		log.Info("refused injection", "err", err)
		return deny(http.StatusBadRequest, "sidecar injection: "+err.Error())
	}
	log.Debug("injected")
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	if patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    code,
		Message: msg,
	}}
}
