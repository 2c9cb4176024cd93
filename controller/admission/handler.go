// Package admission is Istio's validating webhook as canopy-controller
// serves it: AdmissionReview v1 requests for the Istio configuration
// kinds, on /validate and /validate/, refused with what
// controller/validation refuses and worded as Istio's webhook words it
// ("configuration is invalid: ..."), so that a bad object never reaches
// the API server's storage, and from there the proxies.
//
// The chart registers it for every kind of Istio's API groups, as Istio's
// chart does; kinds Canopy does not translate are checked for Istio's
// annotation rules only and allowed. A Handler holds no state but its
// logger and is safe for concurrent use. cmd/canopy-controller serves it
// beside the injection webhook.
package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/validation"
	"github.com/canopy-mesh/canopy/internal/admissionreview"
)

// istioGroups are the API groups of Istio's configuration, which the
// webhook is registered for.
var istioGroups = []string{"networking.istio.io", "security.istio.io", "telemetry.istio.io", "extensions.istio.io"}

// Handler is the validating webhook. Create it with NewHandler.
type Handler struct {
	log *slog.Logger
}

// NewHandler returns the webhook; log may be nil.
func NewHandler(log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{log: log.With("component", "validation")}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/validate" && r.URL.Path != "/validate/" {
		http.NotFound(w, r)
		return
	}
	if err := admissionreview.Serve(w, r, h.review); err != nil {
		h.log.Debug("bad admission review", "err", err)
	}
}

// object is an Istio configuration object as the API server sends it: the
// spec is decoded by kind.
type object struct {
	metav1.TypeMeta
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     json.RawMessage   `json:"spec"`
}

// review answers one admission request.
func (h *Handler) review(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	// Istio's webhook checks what is stored: deletes and connects pass.
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if !slices.Contains(istioGroups, req.Kind.Group) {
		return admissionreview.Deny(http.StatusBadRequest, fmt.Sprintf("unrecognized type %s", req.Kind.String()))
	}
	var obj object
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return admissionreview.Deny(http.StatusBadRequest, "cannot decode configuration: "+err.Error())
	}
	ns := obj.Metadata.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	name := obj.Metadata.Name
	if name == "" {
		name = obj.Metadata.GenerateName + "*"
	}
	spec, err := validate(req.Kind.Kind, ns, name, obj.Metadata.Annotations, obj.Spec)
	if err != nil {
		h.log.Info("refused invalid configuration", "kind", req.Kind.Kind, "namespace", ns, "name", name,
			"dry_run", req.DryRun != nil && *req.DryRun, "err", validation.Summary(err))
		if _, ok := errors.AsType[decodeError](err); ok {
			return admissionreview.Deny(http.StatusBadRequest, err.Error())
		}
		return admissionreview.Deny(http.StatusBadRequest, "configuration is invalid: "+err.Error())
	}
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	// What sidecars will get nothing of is said at once, beside the
	// Warning Event the controller records.
	if fields := untranslated(req.Kind.Kind, spec); len(fields) > 0 {
		resp.Warnings = []string{"Canopy does not translate for sidecars: " + strings.Join(fields, ", ")}
	}
	return resp
}

// untranslated are the fields of a networking spec that Canopy does not
// translate for sidecars (sidecar.UntranslatedFields); none for other
// kinds.
func untranslated(kind string, spec proto.Message) []string {
	switch kind {
	case "DestinationRule", "VirtualService", "ServiceEntry", "Sidecar", "WorkloadEntry":
		if spec != nil {
			return sidecar.UntranslatedFields(kind, spec)
		}
	}
	return nil
}

// decodeError marks a spec that does not decode, which Istio's webhook
// words apart from an invalid one.
type decodeError struct{ err error }

func (e decodeError) Error() string { return "error decoding configuration: " + e.err.Error() }
func (e decodeError) Unwrap() error { return e.err }

// validate checks an object of kind of namespace/name with annotations
// and a spec (JSON), and returns the spec decoded (nil for a kind it does
// not check).
func validate(kind, ns, name string, annotations map[string]string, spec json.RawMessage) (proto.Message, error) {
	if err := validation.Annotations(kind, ns, name, annotations); err != nil {
		return nil, err
	}
	decode := func(m proto.Message) error {
		if len(spec) == 0 || string(spec) == "null" {
			return nil
		}
		// Fields this build does not know (CRDs newer than its
		// istio.io/api) are left out as Istio's webhook leaves them out:
		// refusing them would block valid objects behind failurePolicy
		// Fail. What is known is still checked.
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(spec, m); err != nil {
			return decodeError{err}
		}
		return nil
	}
	switch kind {
	case "VirtualService":
		var s networkingapi.VirtualService
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.VirtualService(ns, &s)
	case "DestinationRule":
		var s networkingapi.DestinationRule
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.DestinationRule(ns, &s)
	case "ServiceEntry":
		var s networkingapi.ServiceEntry
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.ServiceEntry(ns, &s)
	case "Sidecar":
		var s networkingapi.Sidecar
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.Sidecar(ns, &s)
	case "AuthorizationPolicy":
		var s securityapi.AuthorizationPolicy
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.AuthorizationPolicy(ns, name, annotations, &s)
	case "PeerAuthentication":
		var s securityapi.PeerAuthentication
		if err := decode(&s); err != nil {
			return nil, err
		}
		return &s, validation.PeerAuthentication(&s)
	}
	return nil, nil
}
