// Package identity decides which SPIFFE identity the CA signs for an
// authenticated caller (docs/wire-contract.md §6.3): its own, or, for a
// trusted node proxy, the identity it impersonates, but only of a pod that
// runs on the node proxy's own node.
package identity

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Reasons an impersonation is refused; the CA answers Unauthenticated and
// counts them by name.
var (
	ErrUntrustedImpersonator = errors.New("caller may not impersonate")
	ErrMalformedIdentity     = errors.New("malformed impersonated identity")
	ErrForeignTrustDomain    = errors.New("impersonated identity of another trust domain")
	ErrNotPodBound           = errors.New("impersonation needs a pod-bound token")
	ErrCallerPod             = errors.New("caller's pod not found or not the token's")
	ErrNoPodOnNode           = errors.New("no running pod of the impersonated identity on the caller's node")
)

// Account names a service account.
type Account struct{ Namespace, Name string }

// Pods is what the decision reads of the cluster. PodsOnNode lists the pods
// of a namespace scheduled to a node. A cache (an informer's view) fits:
// a pod it has not seen yet is refused, and the node proxy asks again.
// Implementations must be safe for concurrent use and return pods the
// caller must not modify.
type Pods interface {
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	PodsOnNode(ctx context.Context, namespace, node string) ([]*corev1.Pod, error)
}

// Decider picks the identity to sign.
type Decider struct {
	TrustDomain string
	// TrustedNodeAccounts may impersonate (default: the node proxy's).
	TrustedNodeAccounts []Account
	Pods                Pods
}

// Decide returns the identity for caller. An empty impersonated means the
// caller's own identity; otherwise the caller must be a trusted node
// proxy, authenticated by a token bound to its existing pod, and a pod
// that is not finished must run with the impersonated namespace and
// service account on that pod's node.
func (d Decider) Decide(ctx context.Context, caller authn.Caller, impersonated string) (workloadapi.Identity, error) {
	own := workloadapi.Identity{TrustDomain: d.TrustDomain, Namespace: caller.Namespace, ServiceAccount: caller.ServiceAccount}
	if impersonated == "" {
		return own, nil
	}
	want, err := workloadapi.ParseIdentity(impersonated)
	if err != nil {
		return workloadapi.Identity{}, fmt.Errorf("%w: %w", ErrMalformedIdentity, err)
	}
	if want.TrustDomain != d.TrustDomain {
		return workloadapi.Identity{}, fmt.Errorf("%w: %s, this CA signs for %s", ErrForeignTrustDomain, want.TrustDomain, d.TrustDomain)
	}
	if !d.trusted(caller) {
		return workloadapi.Identity{}, fmt.Errorf("%w: %s/%s is not a trusted node proxy account", ErrUntrustedImpersonator, caller.Namespace, caller.ServiceAccount)
	}
	if caller.PodName == "" || caller.PodUID == "" {
		return workloadapi.Identity{}, ErrNotPodBound
	}
	self, err := d.Pods.Pod(ctx, caller.Namespace, caller.PodName)
	if apierrors.IsNotFound(err) || err == nil && (string(self.UID) != caller.PodUID || serviceAccount(self) != caller.ServiceAccount) {
		return workloadapi.Identity{}, fmt.Errorf("%w: %s/%s", ErrCallerPod, caller.Namespace, caller.PodName)
	}
	if err != nil {
		return workloadapi.Identity{}, fmt.Errorf("look up caller pod: %w", err)
	}
	if self.Spec.NodeName == "" {
		return workloadapi.Identity{}, fmt.Errorf("%w: caller pod is not scheduled", ErrCallerPod)
	}
	pods, err := d.Pods.PodsOnNode(ctx, want.Namespace, self.Spec.NodeName)
	if err != nil {
		return workloadapi.Identity{}, fmt.Errorf("list pods on node %s: %w", self.Spec.NodeName, err)
	}
	for _, p := range pods {
		if p.Spec.NodeName == self.Spec.NodeName && serviceAccount(p) == want.ServiceAccount &&
			p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return want, nil
		}
	}
	return workloadapi.Identity{}, fmt.Errorf("%w: %s on node %s", ErrNoPodOnNode, want, self.Spec.NodeName)
}

func (d Decider) trusted(c authn.Caller) bool {
	for _, a := range d.TrustedNodeAccounts {
		if a.Namespace == c.Namespace && a.Name == c.ServiceAccount {
			return true
		}
	}
	return false
}

func serviceAccount(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName == "" {
		return "default"
	}
	return p.Spec.ServiceAccountName
}
