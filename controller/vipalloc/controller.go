package vipalloc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	networkinglisters "istio.io/client-go/pkg/listers/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// FieldManager names the controller's writes.
const FieldManager = "canopy-controller"

// addressIndex indexes ServiceEntries by the addresses they hold.
const addressIndex = "address"

// Controller keeps the status.addresses of every ServiceEntry equal to
// Allocate's. Run it once per process; its one worker serializes the
// allocations, so that one process never hands an address out twice.
type Controller struct {
	client istioclient.Interface
	ranges Ranges
	log    *slog.Logger
	queue  workqueue.TypedRateLimitingInterface[cache.ObjectName]

	factory  istioinformers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   networkinglisters.ServiceEntryLister
}

// New returns a Controller allocating from ranges.
func New(client istioclient.Interface, ranges Ranges, log *slog.Logger) (*Controller, error) {
	if err := ranges.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		client:  client,
		ranges:  ranges,
		log:     log.With("component", "vip-allocation"),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName]()),
		factory: istioinformers.NewSharedInformerFactory(client, 0),
	}
	inf := c.factory.Networking().V1().ServiceEntries()
	c.informer, c.lister = inf.Informer(), inf.Lister()
	err := c.informer.AddIndexers(cache.Indexers{addressIndex: func(obj any) ([]string, error) {
		se, ok := obj.(*networkingv1.ServiceEntry)
		if !ok {
			return nil, nil
		}
		var keys []string
		for _, a := range addresses(se) {
			keys = append(keys, a.String())
		}
		return keys, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("index service entries by address: %w", err)
	}
	_, err = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueue(obj) },
		UpdateFunc: func(old, cur any) { c.enqueue(old); c.enqueue(cur) },
		// A deleted entry frees its addresses; nobody has to move.
	})
	if err != nil {
		return nil, fmt.Errorf("watch service entries: %w", err)
	}
	return c, nil
}

// enqueue queues an entry and every other entry that holds one of its
// addresses, whose claim to it may have changed.
func (c *Controller) enqueue(obj any) {
	se, ok := obj.(*networkingv1.ServiceEntry)
	if !ok {
		return
	}
	c.queue.Add(cache.MetaObjectToName(se))
	for _, a := range addresses(se) {
		for _, h := range c.holders(a) {
			if !same(h, se) {
				c.queue.Add(cache.MetaObjectToName(h))
			}
		}
	}
}

// holders implements Holders from the informer's index.
func (c *Controller) holders(a netip.Addr) []*networkingv1.ServiceEntry {
	objs, err := c.informer.GetIndexer().ByIndex(addressIndex, a.String())
	if err != nil {
		return nil
	}
	out := make([]*networkingv1.ServiceEntry, 0, len(objs))
	for _, o := range objs {
		if se, ok := o.(*networkingv1.ServiceEntry); ok {
			out = append(out, se)
		}
	}
	return out
}

// Run allocates until ctx ends. It allocates nothing before every
// ServiceEntry, and so every address already in a status, is known.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return nil // ctx ended
	}
	c.log.Info("allocating service entry addresses", "ipv4_range", c.ranges.IPv4, "ipv6_range", c.ranges.IPv6)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for {
		key, quit := c.queue.Get()
		if quit {
			return nil
		}
		if err := c.sync(ctx, key); err != nil {
			c.log.Debug("allocate service entry addresses failed, will retry", "service_entry", key.String(), "err", err)
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

// statusPatch is a merge patch of status.addresses, conditional on the
// resourceVersion the addresses were computed from: a write from a stale
// view fails with a conflict instead of replacing a newer status.
type statusPatch struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Status struct {
		// Addresses is null to remove them.
		Addresses []*networkingapi.ServiceEntryAddress `json:"addresses"`
	} `json:"status"`
}

func (c *Controller) sync(ctx context.Context, key cache.ObjectName) error {
	se, err := c.lister.ServiceEntries(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	want := Allocate(se, c.holders, c.ranges)
	if sameAddresses(want, se.Status.GetAddresses()) {
		return nil
	}
	var p statusPatch
	p.Metadata.ResourceVersion = se.ResourceVersion
	p.Status.Addresses = want
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode status patch: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = c.client.NetworkingV1().ServiceEntries(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch status of service entry %s: %w", key, err)
	}
	c.log.Info("service entry addresses set", "service_entry", key.String(), "addresses", addressList(want))
	return nil
}

func sameAddresses(a, b []*networkingapi.ServiceEntryAddress) bool {
	return slices.EqualFunc(a, b, func(x, y *networkingapi.ServiceEntryAddress) bool {
		return x.GetHost() == y.GetHost() && x.GetValue() == y.GetValue()
	})
}

func addressList(as []*networkingapi.ServiceEntryAddress) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.GetHost()+"="+a.GetValue())
	}
	return out
}
