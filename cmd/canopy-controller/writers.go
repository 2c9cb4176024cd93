package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/status"
	"github.com/canopy-mesh/canopy/controller/validation"
	"github.com/canopy-mesh/canopy/controller/vipalloc"
	"github.com/canopy-mesh/canopy/controller/webhookpatch"
)

// writers are the controller's writes to the API server that want a
// single writer: the root-certificate ConfigMap in every namespace, the
// VIPs in ServiceEntries' status, the injector webhooks' caBundle and the
// Events about input the tables cannot represent or sidecars do not get.
// With leader election they run only on the replica holding the Lease;
// every replica serves xDS, the CA and the injection webhook whether it
// leads or not.
//
// Each term builds them anew, with fresh informers and queues: a replica
// that takes over reconciles everything from what the API server holds,
// not from what it saw the last time it led.
type writers struct {
	kube     kubernetes.Interface
	istio    istioclient.Interface
	tables   *index.Index
	synced   <-chan struct{}
	recorder record.EventRecorder
	log      *slog.Logger

	// revision is the injector's, whose webhook configurations get the
	// caBundle; patchWebhooks is false when the controller serves no
	// webhook, patchValidation when it serves no validating webhook.
	// namespace is the controller's, where the validating webhook's probe
	// is sent (a dry run).
	revision        string
	patchWebhooks   bool
	patchValidation bool
	namespace       string
	vipAllocation   bool
	vipRanges       vipalloc.Ranges
	problemInterval time.Duration
	// onTerm, if set, is called as each term starts.
	onTerm func()

	mu     sync.Mutex
	bundle []byte
	// The current term's, nil between terms.
	roots   *rootcm.Publisher
	patcher *webhookpatch.Patcher
}

// SetBundle follows the CA's roots (PEM): the current term's writers
// publish them at once, the next term's start with them.
func (w *writers) SetBundle(bundle []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.bundle = slices.Clone(bundle)
	if w.roots != nil {
		w.roots.SetBundle(w.bundle)
	}
	if w.patcher != nil {
		w.patcher.SetBundle(w.bundle)
	}
}

// run writes until ctx ends (the term ends) or a writer fails.
func (w *writers) run(ctx context.Context) error {
	w.mu.Lock()
	roots, err := rootcm.New(w.kube, w.bundle, w.log)
	if err != nil {
		w.mu.Unlock()
		return fmt.Errorf("root ConfigMaps: %w", err)
	}
	var patcher *webhookpatch.Patcher
	if w.patchWebhooks {
		var opts []webhookpatch.Option
		if w.patchValidation {
			opts = append(opts, webhookpatch.WithValidation(w.validationAnswers))
		}
		if patcher, err = webhookpatch.New(w.kube, w.revision, w.bundle, w.log, opts...); err != nil {
			w.mu.Unlock()
			return fmt.Errorf("webhook caBundle: %w", err)
		}
	}
	var allocator *vipalloc.Controller
	if w.vipAllocation {
		if allocator, err = vipalloc.New(w.istio, w.vipRanges, w.log); err != nil {
			w.mu.Unlock()
			return fmt.Errorf("service entry VIPs: %w", err)
		}
	}
	w.roots, w.patcher = roots, patcher
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.roots, w.patcher = nil, nil
		w.mu.Unlock()
	}()

	if w.onTerm != nil {
		w.onTerm()
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return roots.Run(ctx) })
	if patcher != nil {
		g.Go(func() error { return patcher.Run(ctx) })
	}
	if allocator != nil {
		g.Go(func() error { return allocator.Run(ctx) })
	}
	// A new term reports every current problem again: the former leader's
	// memory of what it reported went with it, and the API server folds
	// repeats of an Event into its count.
	reporter := status.NewReporter(w.recorder)
	// What sidecars do not get of configuration Istio's rules refuse.
	configReporter := status.NewReporterFor(w.recorder, status.ReasonInvalid)
	g.Go(func() error {
		// Problems are reported once the initial lists are in (before, a
		// problem may only mean its cause, a Gateway say, is not listed
		// yet), then every few seconds, which batches the named-port checks.
		select {
		case <-w.synced:
		case <-ctx.Done():
			return nil
		}
		tick := time.NewTicker(w.problemInterval)
		defer tick.Stop()
		for {
			reporter.Report(w.tables.Problems())
			configReporter.Report(w.tables.ConfigProblems())
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	})
	return g.Wait()
}

// validationAnswers reports whether the validating webhook refuses what it
// must (nil), as istiod's validation controller finds out before it
// closes the webhook's failurePolicy: a dry-run create of a VirtualService
// of the revision carrying Istio's always-reject annotation. Only a denial
// by a webhook says the webhook is served and trusted; an accepted object
// says the API server ignored a webhook that failed.
func (w *writers) validationAnswers(ctx context.Context) error {
	rev := w.revision
	if rev == "" {
		rev = "default"
	}
	probe := &networkingv1.VirtualService{
		ObjectMeta: metav1.ObjectMeta{
			Name: "canopy-validation-probe", Namespace: w.namespace,
			Labels:      map[string]string{webhookpatch.LabelRevision: rev},
			Annotations: map[string]string{validation.AnnotationAlwaysReject: "true"},
		},
		Spec: networkingapi.VirtualService{Hosts: []string{"canopy-validation-probe.invalid"}, Http: []*networkingapi.HTTPRoute{{
			Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "canopy-validation-probe.invalid"}}},
		}}},
	}
	_, err := w.istio.NetworkingV1().VirtualServices(w.namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return errors.New("the probe was not refused")
	case probeRefusedByUs(err):
		return nil
	case apierrors.IsNotFound(err) && strings.Contains(err.Error(), "the server could not find the requested resource"):
		// No VirtualService CRD: nothing to validate either.
		return nil
	case strings.Contains(err.Error(), "does not support dry run"):
		// Another webhook without sideEffects None: the probe cannot tell,
		// and would never tell; Istio closes the webhook then too.
		return nil
	}
	return fmt.Errorf("probe refused for another reason: %w", err)
}

// probeRefusedByUs reports whether the probe was refused by Istio's
// validating webhook (ours answers as validation.istio.io or
// rev.validation.istio.io) for its always-reject annotation. Another
// admission controller's denial (a policy engine, say) says nothing of
// whether ours is reachable, and closing the webhook on it would block
// every Istio configuration write while ours is down.
func probeRefusedByUs(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, `validation.istio.io" denied the request`) && strings.Contains(msg, validation.AnnotationAlwaysReject)
}
