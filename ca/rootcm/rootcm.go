// Package rootcm distributes the mesh's trust bundle
// (docs/wire-contract.md §6.4): ConfigMap istio-ca-root-cert, key
// root-cert.pem, in every namespace, created for new namespaces and repaired
// when edited or deleted. The bundle may hold several roots, which is how a
// root rotation avoids downtime. canopy-controller runs a Publisher only on
// the replica holding its writers' Lease, a new one per term.
package rootcm

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Name and key of the ConfigMap.
const (
	ConfigMapName = "istio-ca-root-cert"
	Key           = "root-cert.pem"
)

// Publisher keeps the ConfigMap in every namespace equal to the bundle.
type Publisher struct {
	client kubernetes.Interface
	log    *slog.Logger
	queue  workqueue.TypedRateLimitingInterface[string]

	mu     sync.RWMutex
	bundle string

	namespaces corelisters.NamespaceLister
	configMaps corelisters.ConfigMapLister
	factories  []informers.SharedInformerFactory
	synced     []cache.InformerSynced
}

// New returns a Publisher of bundle (PEM roots).
func New(client kubernetes.Interface, bundle []byte, log *slog.Logger) (*Publisher, error) {
	p := &Publisher{
		client: client,
		log:    log.With("component", "root-configmaps"),
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		bundle: string(bundle),
	}
	nsFactory := informers.NewSharedInformerFactory(client, 0)
	cmFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigMapName).String()
	}))
	nsInf, cmInf := nsFactory.Core().V1().Namespaces(), cmFactory.Core().V1().ConfigMaps()
	p.namespaces, p.configMaps = nsInf.Lister(), cmInf.Lister()
	p.factories = []informers.SharedInformerFactory{nsFactory, cmFactory}
	p.synced = []cache.InformerSynced{nsInf.Informer().HasSynced, cmInf.Informer().HasSynced}
	byName := func(obj any) {
		if o, ok := obj.(metav1.Object); ok {
			p.queue.Add(o.GetName())
		}
	}
	byNamespace := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if o, ok := obj.(metav1.Object); ok {
			p.queue.Add(o.GetNamespace())
		}
	}
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: byName, UpdateFunc: func(_, o any) { byName(o) }}); err != nil {
		return nil, err
	}
	if _, err := cmInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: byNamespace, UpdateFunc: func(_, o any) { byNamespace(o) }, DeleteFunc: byNamespace,
	}); err != nil {
		return nil, err
	}
	return p, nil
}

// SetBundle replaces the bundle (a rotation step) and republishes it
// everywhere.
func (p *Publisher) SetBundle(bundle []byte) {
	p.mu.Lock()
	p.bundle = string(bundle)
	p.mu.Unlock()
	nss, _ := p.namespaces.List(labels.Everything())
	for _, ns := range nss {
		p.queue.Add(ns.Name)
	}
}

// Run publishes until ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	for _, f := range p.factories {
		f.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return ctx.Err()
	}
	go func() {
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	for {
		ns, quit := p.queue.Get()
		if quit {
			return nil
		}
		if err := p.sync(ctx, ns); err != nil {
			p.log.Warn("publish root bundle failed, will retry", "namespace", ns, "err", err)
			p.queue.AddRateLimited(ns)
		} else {
			p.queue.Forget(ns)
		}
		p.queue.Done(ns)
	}
}

func (p *Publisher) sync(ctx context.Context, namespace string) error {
	ns, err := p.namespaces.Get(namespace)
	if apierrors.IsNotFound(err) || err == nil && ns.DeletionTimestamp != nil {
		return nil // gone or going: its ConfigMaps go with it
	}
	if err != nil {
		return err
	}
	p.mu.RLock()
	bundle := p.bundle
	p.mu.RUnlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cms := p.client.CoreV1().ConfigMaps(namespace)
	cur, err := p.configMaps.ConfigMaps(namespace).Get(ConfigMapName)
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Labels: map[string]string{"app.kubernetes.io/managed-by": "canopy-controller"}},
			Data:       map[string]string{Key: bundle},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("configmap appeared meanwhile: %w", err) // retried with the informer's view
		}
		return err
	}
	if err != nil {
		return err
	}
	if cur.Data[Key] == bundle && len(cur.Data) == 1 && len(cur.BinaryData) == 0 {
		return nil
	}
	fixed := cur.DeepCopy()
	fixed.Data = map[string]string{Key: bundle}
	fixed.BinaryData = nil
	_, err = cms.Update(ctx, fixed, metav1.UpdateOptions{})
	return err
}
