// Package removal tells a stopping CNI agent an uninstall from an upgrade:
// the first deletes the agent's DaemonSet, and the agent must then take
// its node's pods out of the mesh and its plugin out of the CNI chain (the
// plugin fails closed: left behind, no pod could start); the second only
// replaces the pod, and the node's pods must stay in the mesh.
//
// The DaemonSet is watched while the agent runs, because by the time the
// agent is told to stop, an uninstaller that deletes everything at once
// (helm uninstall) may have deleted the agent's RBAC and service account
// too, and nothing could be asked any more.
package removal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Watcher watches the DaemonSet that owns this agent's pod.
type Watcher struct {
	kube      kubernetes.Interface
	namespace string
	pod       string
	log       *slog.Logger

	owner   atomic.Pointer[metav1.OwnerReference]
	removed atomic.Bool
	// gone is closed when removed is first set.
	gone chan struct{}
	// synced is closed once the watch can tell an uninstall (or knows it
	// never will have to).
	synced     chan struct{}
	syncedOnce sync.Once
}

// New returns a Watcher for the pod namespace/pod.
func New(kube kubernetes.Interface, namespace, pod string, log *slog.Logger) *Watcher {
	return &Watcher{kube: kube, namespace: namespace, pod: pod, log: log, synced: make(chan struct{}), gone: make(chan struct{})}
}

// Synced is closed once the owning DaemonSet is known and watched (or the
// agent is not run by one). Until then an uninstall that revokes the
// agent's access first could not be told from an upgrade, so the agent is
// not ready before.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

func (w *Watcher) markSynced() { w.syncedOnce.Do(func() { close(w.synced) }) }

// Run finds the owning DaemonSet and watches it until ctx ends. A pod not
// owned by a DaemonSet (run by hand) is never removed.
func (w *Watcher) Run(ctx context.Context) error {
	if w.namespace == "" || w.pod == "" {
		w.log.Info("no pod name and namespace (not run as a pod): stopping never uninstalls")
		w.markSynced()
		return nil
	}
	var owner *metav1.OwnerReference
	for owner == nil {
		pod, err := w.kube.CoreV1().Pods(w.namespace).Get(ctx, w.pod, metav1.GetOptions{})
		if err == nil {
			if owner = metav1.GetControllerOf(pod); owner == nil || owner.Kind != "DaemonSet" {
				w.log.Info("not run by a DaemonSet: stopping never uninstalls")
				w.markSynced()
				<-ctx.Done()
				return nil
			}
			break
		}
		w.log.Warn("cannot read own pod; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
	w.owner.Store(owner)
	lw := cache.NewListWatchFromClient(w.kube.AppsV1().RESTClient(), "daemonsets", w.namespace,
		fields.OneTermEqualSelector("metadata.name", owner.Name))
	inf := cache.NewSharedIndexInformer(lw, &appsv1.DaemonSet{}, 0, cache.Indexers{})
	check := func(obj any) {
		if ds, ok := obj.(*appsv1.DaemonSet); ok && (ds.DeletionTimestamp != nil || ds.UID != owner.UID) {
			w.mark("the DaemonSet is being deleted or was replaced")
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, obj any) { check(obj) },
		DeleteFunc: func(any) { w.mark("the DaemonSet was deleted") },
	}); err != nil {
		return fmt.Errorf("removal: watch DaemonSet %s: %w", owner.Name, err)
	}
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			w.markSynced()
		}
	}()
	inf.Run(ctx.Done())
	return nil
}

func (w *Watcher) mark(why string) {
	if !w.removed.Swap(true) {
		w.log.Info("uninstall under way: stopping will take the node out of the mesh", "why", why)
		close(w.gone)
	}
}

// Removed reports whether the DaemonSet is being deleted: as watched, or,
// when the watch has not seen it (yet), as the API server says now. When
// the API server cannot say, the watch is given until ctx ends: an
// uninstaller that revoked the agent's access first cannot be asked, and
// on a busy node the kubelet's SIGTERM (the DaemonSet's deletion, then
// the garbage collector's, then the kubelet's watch) can outrun the
// agent's own watch event.
func (w *Watcher) Removed(ctx context.Context) (bool, error) {
	if w.removed.Load() {
		return true, nil
	}
	owner := w.owner.Load()
	if owner == nil {
		return false, errors.New("the owning DaemonSet is not known")
	}
	ds, err := w.kube.AppsV1().DaemonSets(w.namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		select {
		case <-w.gone:
			return true, nil
		case <-ctx.Done():
			return false, fmt.Errorf("get DaemonSet %s: %w", owner.Name, err)
		}
	}
	return ds.DeletionTimestamp != nil || ds.UID != owner.UID, nil
}
