// Package scheduler is the local cluster's scheduler: it binds each pod that
// has no node to the least loaded Ready node that fits it (nodeSelector,
// required node affinity, taints and tolerations), so that Deployments and
// DaemonSets applied with kubectl just work. Resources are not accounted.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Name is the scheduler name it serves, the default one.
const Name = corev1.DefaultSchedulerName

// ErrNoFit means no node can run the pod now.
var ErrNoFit = errors.New("no node fits the pod")

// PickNode chooses the node for pod among nodes: schedulable (or the pod
// tolerates that), matching the pod's node selector and required affinity,
// with every NoSchedule/NoExecute taint tolerated (a NotReady node carries
// the node.kubernetes.io/not-ready taint); then the one running fewest pods
// (load counts pods per node name), by name on a tie.
func PickNode(pod *corev1.Pod, nodes []*corev1.Node, load map[string]int) (string, error) {
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var fits []string
	var reasons []string
	for _, n := range nodes {
		if why := unfit(pod, n, affinity); why != "" {
			reasons = append(reasons, n.Name+": "+why)
			continue
		}
		fits = append(fits, n.Name)
	}
	if len(fits) == 0 {
		return "", fmt.Errorf("%w: %v", ErrNoFit, reasons)
	}
	sort.Slice(fits, func(i, j int) bool {
		if load[fits[i]] != load[fits[j]] {
			return load[fits[i]] < load[fits[j]]
		}
		return fits[i] < fits[j]
	})
	return fits[0], nil
}

func unfit(pod *corev1.Pod, n *corev1.Node, affinity nodeaffinity.RequiredNodeAffinity) string {
	if n.Spec.Unschedulable && !tolerates(pod, corev1.TaintNodeUnschedulable) {
		return "unschedulable"
	}
	if ok, err := affinity.Match(n); err != nil || !ok {
		return "node selector or affinity does not match"
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	if untolerated {
		return "has a taint the pod does not tolerate"
	}
	return ""
}

func tolerates(pod *corev1.Pod, key string) bool {
	taint := corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule}
	for _, t := range pod.Spec.Tolerations {
		if t.ToleratesTaint(klog.Background(), &taint, false) {
			return true
		}
	}
	return false
}

// Scheduler binds pending pods.
type Scheduler struct {
	client kubernetes.Interface
	log    *slog.Logger
	pods   corelisters.PodLister
	nodes  corelisters.NodeLister
	queue  workqueue.TypedRateLimitingInterface[string]
	// assumed remembers the node of each pod bound here until the
	// informer shows the binding, so that pods created together spread
	// out. Only the worker touches it.
	assumed map[types.UID]string
	synced  []cache.InformerSynced
	start   func(stop <-chan struct{})
}

// New returns a Scheduler watching through client.
func New(client kubernetes.Interface, log *slog.Logger) (*Scheduler, error) {
	f := informers.NewSharedInformerFactory(client, 0)
	podInf, nodeInf := f.Core().V1().Pods(), f.Core().V1().Nodes()
	s := &Scheduler{
		client:  client,
		log:     log.With("component", "scheduler"),
		pods:    podInf.Lister(),
		nodes:   nodeInf.Lister(),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		assumed: map[types.UID]string{},
		synced:  []cache.InformerSynced{podInf.Informer().HasSynced, nodeInf.Informer().HasSynced},
		start:   f.Start,
	}
	enqueue := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pending(pod) {
			if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
				s.queue.Add(key)
			}
		}
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	// A node that changes may fit pods that waited.
	requeueAll := func(any) {
		pods, _ := s.pods.List(labels.Everything())
		for _, p := range pods {
			enqueue(p)
		}
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    requeueAll,
		UpdateFunc: func(_, obj any) { requeueAll(obj) },
	}); err != nil {
		return nil, err
	}
	return s, nil
}

func pending(pod *corev1.Pod) bool {
	return pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil &&
		(pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == Name) &&
		pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// Run schedules until ctx ends.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	s.start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return ctx.Err()
	}
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		key, quit := s.queue.Get()
		if quit {
			return nil
		}
		err := s.schedule(ctx, key)
		switch {
		case errors.Is(err, ErrNoFit):
			s.queue.AddAfter(key, 2*time.Second)
			s.queue.Forget(key)
		case err != nil:
			s.log.Warn("schedule failed, will retry", "pod", key, "err", err)
			s.queue.AddRateLimited(key)
		default:
			s.queue.Forget(key)
		}
		s.queue.Done(key)
	}
}

func (s *Scheduler) schedule(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := s.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || !pending(pod) {
		return err
	}
	nodes, err := s.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	all, err := s.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	load := map[string]int{}
	seen := map[types.UID]bool{}
	for _, p := range all {
		seen[p.UID] = true
		node := p.Spec.NodeName
		if node == "" {
			node = s.assumed[p.UID]
		} else {
			delete(s.assumed, p.UID)
		}
		if node != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			load[node]++
		}
	}
	for uid := range s.assumed {
		if !seen[uid] {
			delete(s.assumed, uid)
		}
	}
	node, err := PickNode(pod, nodes, load)
	if err != nil {
		s.markUnschedulable(ctx, pod, err)
		return err
	}
	err = s.client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // bound meanwhile, or gone
	}
	if err != nil {
		return fmt.Errorf("bind %s to %s: %w", key, node, err)
	}
	s.assumed[pod.UID] = node
	s.log.Info("bound pod", "pod", key, "node", node)
	return nil
}

// markUnschedulable records why the pod waits, as the kube-scheduler does.
func (s *Scheduler) markUnschedulable(ctx context.Context, pod *corev1.Pod, why error) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message == why.Error() {
			return
		}
	}
	p := pod.DeepCopy()
	cond := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: why.Error(), LastTransitionTime: metav1.Now()}
	replaced := false
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			p.Status.Conditions[i], replaced = cond, true
		}
	}
	if !replaced {
		p.Status.Conditions = append(p.Status.Conditions, cond)
	}
	if _, err := s.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		s.log.Debug("mark pod unschedulable failed", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
}
