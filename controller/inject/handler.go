package inject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/internal/admissionreview"
)

const (
	// MaxRequestBytes bounds an AdmissionReview body.
	MaxRequestBytes = admissionreview.MaxRequestBytes
	// RequestTimeout bounds reading a request and answering it.
	RequestTimeout = admissionreview.RequestTimeout
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
	if err := admissionreview.Serve(w, r, h.review); err != nil {
		h.log.Debug("bad admission review", "err", err)
	}
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
	return admissionreview.Deny(code, msg)
}
