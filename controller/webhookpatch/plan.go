package webhookpatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

const (
	// LabelRevision marks the configurations of a control-plane revision.
	LabelRevision = "istio.io/rev"
	// WebhookSuffix ends the names of the webhooks whose caBundle is kept.
	WebhookSuffix = "sidecar-injector.istio.io"
)

// patchOp is one RFC 6902 operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// Plan returns the JSON Patch that sets caBundle to bundle on every webhook
// of cfg whose name ends in WebhookSuffix and whose caBundle differs, or nil
// when there is nothing to do: cfg is not labelled istio.io/rev=revision
// (revision "" meaning "default"), has no such webhook, or has bundle
// everywhere already. The patch first tests the configuration's
// resourceVersion and each webhook's name, so that it applies only to the
// configuration it was computed from. cfg is not modified.
func Plan(cfg *admissionregistrationv1.MutatingWebhookConfiguration, revision string, bundle []byte) ([]byte, error) {
	if revision == "" {
		revision = "default"
	}
	if cfg == nil || len(bundle) == 0 || cfg.Labels[LabelRevision] != revision || cfg.DeletionTimestamp != nil {
		return nil, nil
	}
	var ops []patchOp
	for i, wh := range cfg.Webhooks {
		if !strings.HasSuffix(wh.Name, WebhookSuffix) || bytes.Equal(wh.ClientConfig.CABundle, bundle) {
			continue
		}
		ops = append(ops,
			patchOp{Op: "test", Path: fmt.Sprintf("/webhooks/%d/name", i), Value: wh.Name},
			// "add" sets a member whether or not it is there.
			patchOp{Op: "add", Path: fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), Value: bundle})
	}
	if len(ops) == 0 {
		return nil, nil
	}
	ops = append([]patchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: cfg.ResourceVersion}}, ops...)
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("marshal caBundle patch: %w", err)
	}
	return b, nil
}

// ValidationWebhookSuffix ends the names of the validating webhooks whose
// caBundle and failurePolicy are kept: Istio's rev.validation.istio.io and
// validation.istio.io.
const ValidationWebhookSuffix = "validation.istio.io"

// PlanValidating returns the JSON Patch that sets caBundle to bundle on
// every webhook of cfg whose name ends in ValidationWebhookSuffix and,
// with failClosed, sets their failurePolicy to Fail; or nil when there is
// nothing to do. The chart installs the configurations with failurePolicy
// Ignore, as Istio's does, so that the API server takes configuration
// while no controller answers yet; once the webhook is seen refusing,
// istiod's controller and this one close it. The same conditions as Plan
// apply (the revision's label, a test of the resourceVersion and of each
// webhook's name). cfg is not modified.
func PlanValidating(cfg *admissionregistrationv1.ValidatingWebhookConfiguration, revision string, bundle []byte, failClosed bool) ([]byte, error) {
	if revision == "" {
		revision = "default"
	}
	if cfg == nil || len(bundle) == 0 || cfg.Labels[LabelRevision] != revision || cfg.DeletionTimestamp != nil {
		return nil, nil
	}
	var ops []patchOp
	for i, wh := range cfg.Webhooks {
		if !strings.HasSuffix(wh.Name, ValidationWebhookSuffix) {
			continue
		}
		setBundle := !bytes.Equal(wh.ClientConfig.CABundle, bundle)
		setFail := failClosed && (wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail)
		if !setBundle && !setFail {
			continue
		}
		ops = append(ops, patchOp{Op: "test", Path: fmt.Sprintf("/webhooks/%d/name", i), Value: wh.Name})
		if setBundle {
			ops = append(ops, patchOp{Op: "add", Path: fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), Value: bundle})
		}
		if setFail {
			ops = append(ops, patchOp{Op: "add", Path: fmt.Sprintf("/webhooks/%d/failurePolicy", i), Value: admissionregistrationv1.Fail})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	ops = append([]patchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: cfg.ResourceVersion}}, ops...)
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("marshal validating webhook patch: %w", err)
	}
	return b, nil
}

// failOpen reports whether a webhook of cfg that PlanValidating keeps has
// a failurePolicy other than Fail.
func failOpen(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) bool {
	for _, wh := range cfg.Webhooks {
		if strings.HasSuffix(wh.Name, ValidationWebhookSuffix) && (wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail) {
			return true
		}
	}
	return false
}
