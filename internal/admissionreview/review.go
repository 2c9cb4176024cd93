// Package admissionreview reads and answers the API server's admission
// webhook requests, AdmissionReview v1 over HTTP, for the webhooks
// canopy-controller serves (sidecar injection, configuration
// validation): the method, content type, size and deadline checks they
// share, and the response's envelope.
//
// It holds no state; anything in controller/ may import it.
package admissionreview

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
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

// Serve answers one webhook request: it checks the method, content type
// and size, decodes the AdmissionReview, calls review with the request
// (under a context bounded by RequestTimeout) and writes its response,
// with the request's UID. A request that is not a well-formed review gets
// an HTTP error, which the API server takes as a failure of the webhook;
// the error returned says why, for the caller's log.
func Serve(w http.ResponseWriter, r *http.Request, review func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed: use POST", http.StatusMethodNotAllowed)
		return nil
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "unsupported content type: want application/json", http.StatusUnsupportedMediaType)
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
	defer cancel()
	// Not every ResponseWriter supports deadlines (tests' recorders do
	// not); the server's own timeouts then still apply.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(RequestTimeout))

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", MaxRequestBytes), http.StatusRequestEntityTooLarge)
			return nil
		}
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return nil
	}
	rev, err := Decode(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return err
	}
	resp := review(ctx, rev.Request)
	resp.UID = rev.Request.UID
	if err := ctx.Err(); err != nil {
		http.Error(w, "request deadline exceeded", http.StatusServiceUnavailable)
		return nil
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return fmt.Errorf("encode admission response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
	return nil
}

// Decode parses an AdmissionReview v1 that carries a request.
func Decode(body []byte) (*admissionv1.AdmissionReview, error) {
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

// Deny is a response refusing the request with code and msg, which the
// API server shows the client after "admission webhook ... denied the
// request: ".
func Deny(code int32, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    code,
		Message: msg,
	}}
}
