// Package kubeinput feeds the table index from Kubernetes: shared informers
// for Namespaces, Nodes, Pods, Services, EndpointSlices, Istio's
// AuthorizationPolicy, PeerAuthentication, ServiceEntry and WorkloadEntry,
// and Gateway API Gateways, each event applied to the index and its change
// set handed on.
//
// It only reads: every replica of the controller runs it, without leader
// election.
package kubeinput

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/canopy-mesh/canopy/controller/index"
)

// Index is what the watcher drives; *index.Index implements it.
type Index interface {
	UpsertNamespace(*corev1.Namespace) index.ChangeSet
	DeleteNamespace(name string) index.ChangeSet
	UpsertNode(*corev1.Node) index.ChangeSet
	DeleteNode(name string) index.ChangeSet
	UpsertPod(*corev1.Pod) index.ChangeSet
	DeletePod(namespace, name string) index.ChangeSet
	UpsertService(*corev1.Service) index.ChangeSet
	DeleteService(namespace, name string) index.ChangeSet
	UpsertEndpointSlice(*discoveryv1.EndpointSlice) index.ChangeSet
	DeleteEndpointSlice(namespace, name string) index.ChangeSet
	UpsertAuthorizationPolicy(*securityv1.AuthorizationPolicy) index.ChangeSet
	DeleteAuthorizationPolicy(namespace, name string) index.ChangeSet
	UpsertPeerAuthentication(*securityv1.PeerAuthentication) index.ChangeSet
	DeletePeerAuthentication(namespace, name string) index.ChangeSet
	UpsertServiceEntry(*networkingv1.ServiceEntry) index.ChangeSet
	DeleteServiceEntry(namespace, name string) index.ChangeSet
	UpsertWorkloadEntry(*networkingv1.WorkloadEntry) index.ChangeSet
	DeleteWorkloadEntry(namespace, name string) index.ChangeSet
	UpsertGateway(*gatewayv1.Gateway) index.ChangeSet
	DeleteGateway(namespace, name string) index.ChangeSet
	UpsertVirtualService(*networkingv1.VirtualService) index.ChangeSet
	DeleteVirtualService(namespace, name string) index.ChangeSet
	UpsertDestinationRule(*networkingv1.DestinationRule) index.ChangeSet
	DeleteDestinationRule(namespace, name string) index.ChangeSet
	UpsertSidecar(*networkingv1.Sidecar) index.ChangeSet
	DeleteSidecar(namespace, name string) index.ChangeSet
}

// Clients are the API clients the watcher lists and watches with.
type Clients struct {
	Kube    kubernetes.Interface
	Istio   istioclient.Interface
	Gateway gatewayclient.Interface
}

// Watcher keeps an Index in step with the cluster.
type Watcher struct {
	clients  Clients
	index    Index
	onChange func(index.ChangeSet)
	log      *slog.Logger
	synced   chan struct{}
}

// New returns a Watcher; onChange (may be nil) receives every non-empty
// change set, from one goroutine per informer.
func New(c Clients, x Index, onChange func(index.ChangeSet), log *slog.Logger) *Watcher {
	if onChange == nil {
		onChange = func(index.ChangeSet) {}
	}
	return &Watcher{clients: c, index: x, onChange: onChange, log: log.With("component", "kubeinput"), synced: make(chan struct{})}
}

// Synced is closed once every object of every informer's initial list
// has been applied to the index and its change set handed to onChange:
// the tables are then those of the whole cluster, not of the part the
// handlers got through. An informer's cache is filled before its
// handlers have run, so a filled cache alone says nothing of the index.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	kube := informers.NewSharedInformerFactory(w.clients.Kube, 0)
	istio := istioinformers.NewSharedInformerFactory(w.clients.Istio, 0)
	gw := gatewayinformers.NewSharedInformerFactory(w.clients.Gateway, 0)

	x := w.index
	var regs []cache.ResourceEventHandlerRegistration
	add := func(reg cache.ResourceEventHandlerRegistration, err error) error {
		regs = append(regs, reg)
		return err
	}
	errs := []error{
		add(register(w, kube.Core().V1().Namespaces().Informer(), x.UpsertNamespace, func(_, name string) index.ChangeSet { return x.DeleteNamespace(name) })),
		add(register(w, kube.Core().V1().Nodes().Informer(), x.UpsertNode, func(_, name string) index.ChangeSet { return x.DeleteNode(name) })),
		add(register(w, kube.Core().V1().Pods().Informer(), x.UpsertPod, x.DeletePod)),
		add(register(w, kube.Core().V1().Services().Informer(), x.UpsertService, x.DeleteService)),
		add(register(w, kube.Discovery().V1().EndpointSlices().Informer(), x.UpsertEndpointSlice, x.DeleteEndpointSlice)),
		add(register(w, istio.Security().V1().AuthorizationPolicies().Informer(), x.UpsertAuthorizationPolicy, x.DeleteAuthorizationPolicy)),
		add(register(w, istio.Security().V1().PeerAuthentications().Informer(), x.UpsertPeerAuthentication, x.DeletePeerAuthentication)),
		add(register(w, istio.Networking().V1().ServiceEntries().Informer(), x.UpsertServiceEntry, x.DeleteServiceEntry)),
		add(register(w, istio.Networking().V1().WorkloadEntries().Informer(), x.UpsertWorkloadEntry, x.DeleteWorkloadEntry)),
		add(register(w, gw.Gateway().V1().Gateways().Informer(), x.UpsertGateway, x.DeleteGateway)),
		add(register(w, istio.Networking().V1().VirtualServices().Informer(), x.UpsertVirtualService, x.DeleteVirtualService)),
		add(register(w, istio.Networking().V1().DestinationRules().Informer(), x.UpsertDestinationRule, x.DeleteDestinationRule)),
		add(register(w, istio.Networking().V1().Sidecars().Informer(), x.UpsertSidecar, x.DeleteSidecar)),
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("register informer handlers: %w", err)
	}
	kube.Start(ctx.Done())
	istio.Start(ctx.Done())
	gw.Start(ctx.Done())
	// A registration has synced once its informer has and its handler
	// has returned for every object of the initial list.
	checkers := make([]cache.DoneChecker, len(regs))
	for i, r := range regs {
		checkers[i] = r.HasSyncedChecker()
	}
	if !cache.WaitFor(ctx, "", checkers...) {
		return fmt.Errorf("informers did not sync: %w", context.Cause(ctx))
	}
	close(w.synced)
	w.log.Info("informers synced")
	<-ctx.Done()
	kube.Shutdown()
	istio.Shutdown()
	gw.Shutdown()
	return nil
}

type object interface {
	GetNamespace() string
	GetName() string
}

// register applies an informer's events to the index.
func register[T object](w *Watcher, inf cache.SharedIndexInformer, upsert func(T) index.ChangeSet, del func(namespace, name string) index.ChangeSet) (cache.ResourceEventHandlerRegistration, error) {
	emit := func(cs index.ChangeSet) {
		if !cs.Empty() {
			w.onChange(cs)
		}
	}
	return inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok {
				emit(upsert(o))
			}
		},
		UpdateFunc: func(_, obj any) {
			if o, ok := obj.(T); ok {
				emit(upsert(o))
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(T); ok {
				emit(del(o.GetNamespace(), o.GetName()))
			}
		},
	})
}
