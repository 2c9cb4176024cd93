// Package kubeapply applies and deletes arbitrary objects (a rendered
// chart, a sample app) with server-side apply, the way kubectl apply
// --server-side does, resolving kinds through the API server's discovery.
package kubeapply

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Applier applies objects as one field manager.
type Applier struct {
	client       dynamic.Interface
	mapper       *restmapper.DeferredDiscoveryRESTMapper
	fieldManager string
	dryRun       bool
	force        bool
}

// Options configure an Applier.
type Options struct {
	// FieldManager owns the applied fields; default "canopyctl".
	FieldManager string
	// DryRun asks the API server to validate and admit without storing.
	DryRun bool
	// NoForce leaves fields another manager owns alone: a conflict is an
	// error naming the manager (see IsConflict) instead of a takeover.
	NoForce bool
}

// New returns an Applier for the cluster of cfg.
func New(cfg *rest.Config, opts Options) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	if opts.FieldManager == "" {
		opts.FieldManager = "canopyctl"
	}
	return &Applier{
		client:       client,
		mapper:       restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		fieldManager: opts.FieldManager,
		dryRun:       opts.DryRun,
		force:        !opts.NoForce,
	}, nil
}

// Apply applies each object in order, taking over fields other managers
// own (as an installer must) unless NoForce was set. It stops at the first
// failure.
func (a *Applier) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		ri, err := a.resource(o)
		if err != nil {
			return err
		}
		body, err := o.MarshalJSON()
		if err != nil {
			return fmt.Errorf("%s: %w", Describe(o), err)
		}
		opts := metav1.PatchOptions{FieldManager: a.fieldManager, Force: ptr(a.force)}
		if a.dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts); err != nil {
			return fmt.Errorf("apply %s: %w", Describe(o), err)
		}
	}
	return nil
}

// Delete deletes the objects in reverse order; missing ones (and kinds the
// cluster no longer serves) are skipped. It returns the first error after
// trying them all.
func (a *Applier) Delete(ctx context.Context, objs []*unstructured.Unstructured) error {
	var first error
	for _, o := range slices.Backward(objs) {
		ri, err := a.resource(o)
		if meta.IsNoMatchError(err) {
			continue
		}
		if err == nil {
			policy := metav1.DeletePropagationBackground
			err = ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy})
		}
		if err != nil && !apierrors.IsNotFound(err) && first == nil {
			first = fmt.Errorf("delete %s: %w", Describe(o), err)
		}
	}
	return first
}

// resource finds the API resource of o; an unknown kind refreshes
// discovery once, since CRDs applied a moment ago add kinds.
func (a *Applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Describe(o), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.client.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.client.Resource(m.Resource), nil
}

// IsConflict reports a server-side apply conflict: fields of the object
// are owned by another manager.
func IsConflict(err error) bool { return apierrors.IsConflict(err) }

// Describe names an object as kubectl does: kind/namespace/name.
func Describe(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", o.GetKind(), ns, o.GetName())
	}
	return fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
}

func ptr[T any](v T) *T { return &v }
