package webhookpatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// Patcher keeps the caBundle of one revision's injector webhooks current
// and, with WithValidation, the caBundle and failurePolicy of its
// validating webhooks.
type Patcher struct {
	client   kubernetes.Interface
	revision string
	log      *slog.Logger
	queue    workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	bundle []byte

	configs admissionlisters.MutatingWebhookConfigurationLister
	factory informers.SharedInformerFactory
	synced  []cache.InformerSynced

	// The validating configurations, when kept: their lister; ready, which
	// reports whether the validating webhook answers (nil error: it
	// refused what it must refuse); and whether it has, this term.
	validating admissionlisters.ValidatingWebhookConfigurationLister
	ready      func(context.Context) error
	answered   atomic.Bool
}

// validatingKey prefixes the queue keys of validating configurations
// (configuration names never hold a '/').
const validatingKey = "validating/"

// Option configures a Patcher.
type Option func(*Patcher)

// WithValidation makes the Patcher keep the revision's
// ValidatingWebhookConfigurations too: the caBundle of their webhooks
// named *validation.istio.io, and, once ready returns nil (the webhook
// refused a probe it must refuse: it is served, and the API server trusts
// its certificate), their failurePolicy Fail, as istiod's validation
// controller does. Until then they stay as the chart installs them,
// failing open, and the Patcher asks ready again with a backoff.
func WithValidation(ready func(context.Context) error) Option {
	return func(p *Patcher) { p.ready = ready }
}

// New returns a Patcher for revision ("" meaning "default") that writes
// bundle (PEM root certificates). log must not be nil.
func New(client kubernetes.Interface, revision string, bundle []byte, log *slog.Logger, opts ...Option) (*Patcher, error) {
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
		// Retries back off to a minute at most, as istiod's validation
		// controller's do: the validating webhook is usually answering a
		// few seconds after the controller starts.
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Minute)),
		bundle: slices.Clone(bundle),
	}
	for _, o := range opts {
		o(p)
	}
	// Only this revision's configurations are listed and watched.
	p.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{LabelRevision: revision}).String()
	}))
	handler := func(prefix string) cache.ResourceEventHandlerFuncs {
		enqueue := func(obj any) {
			if o, ok := obj.(metav1.Object); ok {
				p.queue.Add(prefix + o.GetName())
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}
	}
	inf := p.factory.Admissionregistration().V1().MutatingWebhookConfigurations()
	p.configs = inf.Lister()
	p.synced = append(p.synced, inf.Informer().HasSynced)
	if _, err := inf.Informer().AddEventHandler(handler("")); err != nil {
		return nil, fmt.Errorf("new webhook patcher: %w", err)
	}
	if p.ready != nil {
		vinf := p.factory.Admissionregistration().V1().ValidatingWebhookConfigurations()
		p.validating = vinf.Lister()
		p.synced = append(p.synced, vinf.Informer().HasSynced)
		if _, err := vinf.Informer().AddEventHandler(handler(validatingKey)); err != nil {
			return nil, fmt.Errorf("new webhook patcher: %w", err)
		}
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
	p.enqueueAll()
}

func (p *Patcher) enqueueAll() {
	cfgs, _ := p.configs.List(labels.Everything())
	for _, c := range cfgs {
		p.queue.Add(c.Name)
	}
	if p.validating != nil {
		vcfgs, _ := p.validating.List(labels.Everything())
		for _, c := range vcfgs {
			p.queue.Add(validatingKey + c.Name)
		}
	}
}

// Run patches until ctx ends.
func (p *Patcher) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), p.synced...) {
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
			if errors.Is(err, errNotAnswering) {
				p.log.Debug("validating webhook configuration left open", "webhook_configuration", name)
			} else {
				p.log.Warn("patch webhook configuration failed, will retry", "webhook_configuration", name, "err", err)
			}
			p.queue.AddRateLimited(name)
		} else {
			p.queue.Forget(name)
		}
		p.queue.Done(name)
	}
}

// errNotAnswering: a validating configuration stays open until the
// webhook is seen refusing.
var errNotAnswering = errors.New("the validating webhook has not refused its probe yet: failurePolicy stays Ignore")

// sync patches one configuration if its caBundle differs (or, for a
// validating one, its failurePolicy should close). The informer's object
// is only read.
func (p *Patcher) sync(ctx context.Context, key string) error {
	if name, ok := strings.CutPrefix(key, validatingKey); ok {
		return p.syncValidating(ctx, name)
	}
	name := key
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

// syncValidating patches one validating configuration: its caBundle, and
// its failurePolicy to Fail once the webhook has answered. While it has
// not, the caBundle is written alone (the API server needs it to trust
// the webhook at all) and errNotAnswering has the key retried.
func (p *Patcher) syncValidating(ctx context.Context, name string) error {
	cfg, err := p.validating.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	bundle := p.bundle
	p.mu.Unlock()
	open := failOpen(cfg) && cfg.Labels[LabelRevision] == p.revision
	closeNow := open && p.answeredProbe(ctx)
	patch, err := PlanValidating(cfg, p.revision, bundle, closeNow)
	if err != nil {
		return err
	}
	if patch != nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = p.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(pctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("patch %s: %w", name, err)
		}
		p.log.Info("set validating webhook caBundle", "webhook_configuration", name, "fail_closed", closeNow)
	}
	if open && !closeNow {
		return errNotAnswering
	}
	return nil
}

// answeredProbe reports whether the validating webhook has refused the
// probe, asking it again until it has; once it has, every validating
// configuration is looked at again.
func (p *Patcher) answeredProbe(ctx context.Context) bool {
	if p.answered.Load() {
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.ready(pctx); err != nil {
		p.log.Debug("validating webhook not answering yet", "err", err)
		return false
	}
	p.log.Info("validating webhook refused its probe: closing its failurePolicy")
	p.answered.Store(true)
	p.enqueueAll()
	return true
}
