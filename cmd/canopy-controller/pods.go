package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/controller/index"
)

// indexPods answers the CA's impersonation checks from the pods the
// informers keep in the index, instead of a GET and a LIST against the API
// server per certificate. Until the informers have synced it waits (within
// the request's context): an empty view would refuse every node proxy.
type indexPods struct {
	tables *index.Index
	synced <-chan struct{}
}

var _ identity.Pods = indexPods{}

func (p indexPods) wait(ctx context.Context) error {
	select {
	case <-p.synced:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the pod informer: %w", ctx.Err())
	}
}

// Pod implements identity.Pods.
func (p indexPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if err := p.wait(ctx); err != nil {
		return nil, err
	}
	if pod := p.tables.Pod(namespace, name); pod != nil {
		return pod, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
}

// PodsOnNode implements identity.Pods.
func (p indexPods) PodsOnNode(ctx context.Context, namespace, node string) ([]*corev1.Pod, error) {
	if err := p.wait(ctx); err != nil {
		return nil, err
	}
	return p.tables.PodsOnNode(namespace, node), nil
}
