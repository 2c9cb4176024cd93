package testenv

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TokenOptions shape a minted service-account token.
type TokenOptions struct {
	// Audiences of the token; empty means the API server's own.
	Audiences []string
	// Pod, when set, binds the token to that pod (by name and UID), as a
	// kubelet does for a projected token: the token dies with the pod and a
	// TokenReview reports the pod's name and UID.
	Pod *corev1.Pod
	// Expiration defaults to one hour.
	Expiration time.Duration
}

// Token mints a token for service account namespace/name through the
// TokenRequest API.
func (e *Environment) Token(ctx context.Context, namespace, name string, opts TokenOptions) (string, error) {
	if opts.Expiration == 0 {
		opts.Expiration = time.Hour
	}
	seconds := int64(opts.Expiration / time.Second)
	req := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         opts.Audiences,
			ExpirationSeconds: &seconds,
		},
	}
	if opts.Pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind:       "Pod",
			APIVersion: "v1",
			Name:       opts.Pod.Name,
			UID:        opts.Pod.UID,
		}
	}
	resp, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("mint token for %s/%s: %w", namespace, name, err)
	}
	return resp.Status.Token, nil
}
