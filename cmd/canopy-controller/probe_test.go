package main

import (
	"errors"
	"testing"
)

// TestProbeRefusedByUs: only a refusal by Istio's validating webhook for
// the always-reject annotation closes the webhook; another admission
// controller's denial must not, or every Istio configuration write would
// be blocked while ours is unreachable.
func TestProbeRefusedByUs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{`admission webhook "rev.validation.istio.io" denied the request: configuration is invalid: "internal.istio.io/webhook-always-reject" annotation found, rejecting`, true},
		{`admission webhook "validation.istio.io" denied the request: configuration is invalid: "internal.istio.io/webhook-always-reject" annotation found, rejecting`, true},
		{`admission webhook "validate.kyverno.svc-fail" denied the request: policy require-labels failed`, false},
		{`admission webhook "validation.gatekeeper.sh" denied the request: [deny-all] internal.istio.io/webhook-always-reject`, false},
		{`admission webhook "rev.validation.istio.io" denied the request: configuration is invalid: host not found`, false},
		{`Internal error occurred: failed calling webhook "rev.validation.istio.io": connection refused`, false},
	} {
		if got := probeRefusedByUs(errors.New(tt.msg)); got != tt.want {
			t.Errorf("probeRefusedByUs(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
}
