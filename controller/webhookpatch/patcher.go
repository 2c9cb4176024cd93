package webhookpatch

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	admissionlisters "k8s.io/client-go/listers/admissionregistration/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Patcher keeps the caBundle of one revision's injector webhooks current.
type Patcher struct {
	client   kubernetes.Interface
	revision string
	log      *slog.Logger
	queue    workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	bundle []byte

	configs admissionlisters.MutatingWebhookConfigurationLister
	factory informers.SharedInformerFactory
	synced  cache.InformerSynced
}

// New returns a Patcher for revision ("" meaning "default") that writes
// bundle (PEM root certificates). log must not be nil.
func New(client kubernetes.Interface, revision string, bundle []byte, log *slog.Logger) (*Patcher, error) {
	if revision == "" {
		revision = "default"
	}
	if len(bundle) == 0 {
		return nil, fmt.Errorf("new webhook patcher: empty CA bundle")
	}
	p := &Patcher{
		client:   client,
		revision: revision,
		log:      log.With("component", "webhook-patcher", "revision", revision),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		bundle:   slices.Clone(bundle),
	}
	// Only this revision's configurations are listed and watched.
	p.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{LabelRevision: revision}).String()
	}))
	inf := p.factory.Admissionregistration().V1().MutatingWebhookConfigurations()
	p.configs, p.synced = inf.Lister(), inf.Informer().HasSynced
	enqueue := func(obj any) {
		if o, ok := obj.(metav1.Object); ok {
			p.queue.Add(o.GetName())
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
	}); err != nil {
		return nil, fmt.Errorf("new webhook patcher: %w", err)
	}
	return p, nil
}

// SetBundle replaces the bundle (the roots changed) and patches every
// configuration again.
func (p *Patcher) SetBundle(bundle []byte) {
	if len(bundle) == 0 {
		return
	}
	p.mu.Lock()
	p.bundle = slices.Clone(bundle)
	p.mu.Unlock()
	cfgs, _ := p.configs.List(labels.Everything())
	for _, c := range cfgs {
		p.queue.Add(c.Name)
	}
}

// Run patches until ctx ends.
func (p *Patcher) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), p.synced) {
		return nil // ctx ended
	}
	p.log.Info("webhook patcher synced")
	go func() {
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	for {
		name, quit := p.queue.Get()
		if quit {
			return nil
		}
		if err := p.sync(ctx, name); err != nil {
			p.log.Warn("patch webhook caBundle failed, will retry", "webhook_configuration", name, "err", err)
			p.queue.AddRateLimited(name)
		} else {
			p.queue.Forget(name)
		}
		p.queue.Done(name)
	}
}

// sync patches one configuration if its caBundle differs. The informer's
// object is only read.
func (p *Patcher) sync(ctx context.Context, name string) error {
	cfg, err := p.configs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	bundle := p.bundle
	p.mu.Unlock()
	patch, err := Plan(cfg, p.revision, bundle)
	if err != nil || patch == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = p.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		// A failed test (the configuration changed meanwhile) comes back
		// as an error too; the informer's next view is planned again.
		return fmt.Errorf("patch %s: %w", name, err)
	}
	p.log.Info("set webhook caBundle", "webhook_configuration", name)
	return nil
}
