package parity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// annotationDelete marks a fixture (with a finalizer) that is deleted once
// created, so that it stays terminating.
const annotationDelete = "parity.canopy.dev/delete"

// applier creates the objects of a fixture file in order.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(cfg *rest.Config) (*applier, error) {
	cfg = rest.CopyConfig(cfg)
	// Deprecation warnings (PreferClose) are expected of some fixtures.
	cfg.WarningHandler = rest.NoWarnings{}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// applyFile creates every object of a multi-document YAML file, in order.
func (a *applier) applyFile(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := a.apply(ctx, &obj); err != nil {
			return fmt.Errorf("%s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
}

func (a *applier) resource(gvk schema.GroupVersionKind, namespace string) (dynamic.ResourceInterface, error) {
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	if namespace == "" {
		return a.dyn.Resource(m.Resource), nil
	}
	return a.dyn.Resource(m.Resource).Namespace(namespace), nil
}

// apply creates one object: owner UIDs filled in, then the status written
// (pods only), then deleted when marked so.
func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	refs := obj.GetOwnerReferences()
	for i, ref := range refs {
		if ref.UID != "" {
			continue
		}
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return err
		}
		owners, err := a.resource(gv.WithKind(ref.Kind), obj.GetNamespace())
		if err != nil {
			return err
		}
		owner, err := owners.Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("owner %s %s: %w", ref.Kind, ref.Name, err)
		}
		refs[i].UID = owner.GetUID()
	}
	obj.SetOwnerReferences(refs)
	if err := a.fillTargetRefUIDs(ctx, obj); err != nil {
		return err
	}
	status, hasStatus := obj.Object["status"]
	delete(obj.Object, "status")
	res, err := a.resource(obj.GroupVersionKind(), obj.GetNamespace())
	if err != nil {
		return err
	}
	created, err := res.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if hasStatus && obj.GetKind() == "Pod" {
		created.Object["status"] = status
		if _, err := res.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	}
	if obj.GetKind() == "Namespace" {
		// Pods are refused until the namespace's default service
		// account exists.
		sa := schema.GroupVersionKind{Version: "v1", Kind: "ServiceAccount"}
		sas, err := a.resource(sa, obj.GetName())
		if err != nil {
			return err
		}
		err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := sas.Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("wait for its default service account: %w", err)
		}
	}
	if obj.GetAnnotations()[annotationDelete] == "true" {
		if err := res.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// fillTargetRefUIDs gives each endpoint of an EndpointSlice whose
// targetRef has an empty uid the uid of the object it names.
func (a *applier) fillTargetRefUIDs(ctx context.Context, obj *unstructured.Unstructured) error {
	if obj.GetKind() != "EndpointSlice" {
		return nil
	}
	eps, _, err := unstructured.NestedSlice(obj.Object, "endpoints")
	if err != nil {
		return err
	}
	for _, ep := range eps {
		ref, ok := ep.(map[string]any)["targetRef"].(map[string]any)
		if !ok {
			continue
		}
		if uid, ok := ref["uid"]; !ok || uid != "" {
			continue
		}
		kind, _ := ref["kind"].(string)
		name, _ := ref["name"].(string)
		ns, _ := ref["namespace"].(string)
		res, err := a.resource(schema.GroupVersionKind{Version: "v1", Kind: kind}, ns)
		if err != nil {
			return err
		}
		target, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("targetRef %s %s/%s: %w", kind, ns, name, err)
		}
		ref["uid"] = string(target.GetUID())
	}
	return unstructured.SetNestedSlice(obj.Object, eps, "endpoints")
}

// waitAdopted waits until every pod of the namespaces that carries a
// ReplicaSet's hash label has been adopted by its ReplicaSet.
func waitAdopted(ctx context.Context, client kubernetes.Interface, namespaces ...string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, ns := range namespaces {
			pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, p := range pods.Items {
				if hashed(p) && metav1.GetControllerOf(&p) == nil {
					return false, nil
				}
			}
		}
		return true, nil
	})
}

func hashed(p corev1.Pod) bool {
	return p.Labels["pod-template-hash"] != "" || p.Labels["rollouts-pod-template-hash"] != ""
}

// annotationResync is written onto every EndpointSlice by
// resyncEndpointSlices.
const annotationResync = "parity.canopy.dev/resync"

// resyncEndpointSlices writes an annotation onto every EndpointSlice of the
// namespaces, so that istiod handles each slice again. istiod decides an
// endpoint's health when it handles the slice, and a not-ready endpoint
// counts as terminating only if the slice's Service is already in its
// registry; a Service handled later does not rebuild its endpoints
// (addOrUpdateService in pilot/pkg/serviceregistry/kube/controller), so
// when the two informers deliver in the other order, the terminating pod
// of the fixture stays an UNHEALTHY endpoint in istiod's EDS (seen once in
// a clean-clone CI run, for apps/nearby). The second handling, with every
// Service known, gives the reference its intended, deterministic answer.
func resyncEndpointSlices(ctx context.Context, client kubernetes.Interface, namespaces ...string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, annotationResync, time.Now().Format(time.RFC3339Nano))
	for _, ns := range namespaces {
		slices, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list EndpointSlices of %s: %w", ns, err)
		}
		for _, s := range slices.Items {
			if _, err := client.DiscoveryV1().EndpointSlices(ns).Patch(ctx, s.Name, k8stypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("annotate EndpointSlice %s/%s: %w", ns, s.Name, err)
			}
		}
	}
	return nil
}
