package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
)

// running reports whether a pod has (or may still get) a live netns.
func running(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// reconcile makes the kernel match the cluster for every pod of the node.
// It takes one pod at a time (its lock, locks.go): a CNI ADD of another pod
// goes ahead meanwhile.
func (a *Agent) reconcile(ctx context.Context) {
	start := a.cfg.Now()
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		a.log.Error("list pods", "err", err)
		return
	}
	seen := map[types.UID]bool{}
	exists := map[types.UID]bool{}
	// The node's processes are read once per pass, when a pod needs them.
	var procs podNamespaces
	scan := func() podNamespaces {
		if procs == nil {
			var err error
			if procs, err = a.finder.scan(); err != nil {
				a.log.Warn("cannot read the node's processes", "err", err)
				procs = podNamespaces{}
			}
		}
		return procs
	}
	unenrollable := 0
	for _, pod := range pods {
		if ctx.Err() != nil {
			return
		}
		exists[pod.UID] = true
		d, derr := a.decide(pod)
		keep := d.Enroll && running(pod)
		if keep {
			seen[pod.UID] = true
		}
		if !a.reconcilePod(ctx, pod, d, derr, keep, scan) {
			unenrollable++
		}
	}
	for _, m := range a.members() {
		if !seen[m.uid] {
			a.unenrollGone(ctx, m)
		}
	}
	a.metrics.unenrollable.Set(float64(unenrollable))
	a.collectPins()
	a.verifyHost()
	a.forgetGone(exists, start)
}

// reconcilePod enrolls, verifies or un-enrolls one pod, under its lock. It
// reports false for a pod that should be enrolled and cannot be. derr is
// a pod for the mesh whose settings cannot be applied (enroll.Decide).
func (a *Agent) reconcilePod(ctx context.Context, pod *corev1.Pod, d enroll.Decision, derr error, keep bool, scan func() podNamespaces) bool {
	unlock := a.locks.lock(pod.UID)
	defer unlock()
	m := a.memberOf(pod.UID)
	if !keep {
		if m != nil {
			a.unenrollPod(ctx, m, pod)
		}
		return true
	}
	ips := podIPs(pod)
	if len(ips) == 0 {
		return true // not networked yet: the plugin's ADD comes first
	}
	if derr != nil {
		return a.keepInvalid(ctx, pod, m, ips, derr, scan)
	}
	if m != nil && m.sidecar() != (d.Pod.Sidecar != nil) {
		// Its mode changed (a sidecar status added or removed): out of
		// the old mode entirely, then in the new one.
		a.unenrollPod(ctx, m, pod)
		m = nil
	}
	if m == nil {
		return a.enrollRunning(ctx, pod, ips, d.Pod, scan)
	}
	a.verify(ctx, pod, m, ips, d.Pod, scan, "")
	return true
}

// keepInvalid handles a pod whose settings became malformed or
// unsupported (its annotations are mutable). An enrolled pod keeps the
// rules it has, still verified and repaired: removing them would let its
// traffic around the proxy. A pod not enrolled cannot be, and says why.
func (a *Agent) keepInvalid(ctx context.Context, pod *corev1.Pod, m *member, ips []netip.Addr, derr error, scan func() podNamespaces) bool {
	key := pod.Namespace + "/" + pod.Name
	if m != nil {
		a.log.Warn("pod's settings cannot be applied; keeping its rules as they are", "pod", key, "err", derr)
		a.verify(ctx, pod, m, ips, m.cfg, scan, "rules kept as last applied; the pod's settings cannot be applied: "+derr.Error())
		return true
	}
	a.log.Warn("cannot enroll pod", "pod", key, "err", derr)
	if err := a.publish(ctx, pod, "", false, ReasonInvalidSettings, derr.Error(), a.cfg.Now()); err != nil {
		a.log.Warn("cannot publish", "pod", key, "err", err)
	}
	return false
}

// unenrollGone takes out an enrolled pod the pass did not list, once the
// API server confirms it is gone: a pod whose ADD just enrolled it may not
// have reached the informer yet.
func (a *Agent) unenrollGone(ctx context.Context, m *member) {
	unlock := a.locks.lock(m.uid)
	defer unlock()
	if a.memberOf(m.uid) != m {
		return // replaced or removed meanwhile
	}
	pod, err := a.kube.CoreV1().Pods(m.namespace).Get(ctx, m.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && pod.UID != m.uid):
		a.unenrollPod(ctx, m, nil)
	case err != nil:
		a.log.Warn("cannot tell whether an enrolled pod still exists", "pod", m.namespace+"/"+m.name, "err", err)
	default:
		// Too new for the informer: the next pass sees it.
	}
}

// forgetGone removes the records of pods that no longer exist. A record
// written since the pass began may be a pod the informer has not shown
// yet, and stays.
func (a *Agent) forgetGone(exists map[types.UID]bool, start time.Time) {
	uids, err := a.records.older(start)
	if err != nil {
		a.log.Warn("cannot list the pods' records", "err", err)
		return
	}
	for _, uid := range uids {
		if !exists[uid] {
			if err := a.records.remove(uid); err != nil {
				a.log.Warn("cannot forget a pod's network namespace", "uid", uid, "err", err)
			}
		}
	}
}

// enrollRunning enrolls a pod that runs without the agent having seen its
// ADD in this run: started before the agent, or while the plugin was
// missing from the CNI configuration. Its netns is found by the pod's
// identity (netns.go): the one its ADD recorded, else the one its
// processes live in. Its IP only checks what was found.
func (a *Agent) enrollRunning(ctx context.Context, pod *corev1.Pod, ips []netip.Addr, cfg redirect.PodConfig, scan func() podNamespaces) bool {
	key := pod.Namespace + "/" + pod.Name
	rec, ok, err := a.records.load(pod.UID)
	if err != nil {
		a.log.Warn("cannot read the pod's record", "pod", key, "err", err)
	}
	if ok {
		f, err := openRecorded(rec, ips[0])
		if err == nil {
			return a.enrollPod(ctx, pod, f, rec.Netns, true, ips, cfg) == nil
		}
		// The sandbox was replaced behind the agent's back.
		a.log.Info("the pod's recorded network namespace is gone; looking for its processes", "pod", key, "err", err)
		if err := a.records.remove(pod.UID); err != nil {
			a.log.Warn("cannot forget the pod's network namespace", "pod", key, "err", err)
		}
	}
	f, err := open(scan()[pod.UID], ips[0])
	if err != nil {
		msg := err.Error()
		a.log.Warn("cannot enroll running pod", "pod", key, "reason", msg)
		if perr := a.publish(ctx, pod, "", false, ReasonNoNetns, msg, a.cfg.Now()); perr != nil {
			a.log.Warn("cannot publish", "err", perr)
		}
		return false
	}
	return a.enrollPod(ctx, pod, f, "the network namespace of the pod's processes", true, ips, cfg) == nil
}

// verify checks an enrolled pod against the kernel and repairs it. A
// note, when given, is published as the condition's message, with reason
// ReasonInvalidSettings, instead of the plain verified one.
func (a *Agent) verify(ctx context.Context, pod *corev1.Pod, m *member, ips []netip.Addr, cfg redirect.PodConfig, scan func() podNamespaces, note string) {
	key := pod.Namespace + "/" + pod.Name
	mode := modeOf(cfg)
	// A pod whose sandbox was recreated has a new netns: the old handle
	// no longer holds its IP.
	if !holdsFd(m.netns, ips[0]) {
		a.metrics.verifications.WithLabelValues("netns_replaced", mode).Inc()
		a.log.Warn("pod's network namespace was replaced; enrolling the new one", "pod", key)
		a.enrollRunning(ctx, pod, ips, cfg, scan)
		return
	}
	outcome, reason := "verified", ReasonVerified
	// The kernel is held to what the pod should have now: without DNS
	// capture until a node proxy serves it (phased), so a pass never
	// turns on what the ack has not, nor takes away what it has.
	want := phased(cfg, m.served)
	err := a.backend.Verify(m.path(), want)
	var drift *redirect.DriftError
	switch {
	case err == nil && m.cfg.Equal(cfg):
	case err == nil || errors.As(err, &drift):
		// Drifted behind the agent's back, or the pod's settings changed.
		a.log.Warn("pod's redirection differs from its rules; repairing", "pod", key, "drift", err)
		if rerr := a.backend.Enroll(m.path(), want); rerr != nil {
			a.metrics.verifications.WithLabelValues("failed", mode).Inc()
			_ = a.publish(ctx, pod, "", false, ReasonFailed, rerr.Error(), a.cfg.Now())
			return
		}
		m.cfg = cfg
		outcome, reason = "repaired", ReasonRepaired
	default:
		a.metrics.verifications.WithLabelValues("failed", mode).Inc()
		a.log.Error("cannot verify pod", "pod", key, "err", err)
		return
	}
	a.metrics.verifications.WithLabelValues(outcome, mode).Inc()
	a.checkSockets(m)
	now := a.cfg.Now()
	m.verified = now
	state := m.state
	if state == enroll.RedirectionPending {
		reason = ReasonPending
	}
	msg := "redirection verified in the pod's network namespace"
	// A sidecar pod carries no redirection annotation; state stays empty,
	// which publish leaves alone.
	stale := !m.sidecar() && pod.Annotations[enroll.AnnotationRedirection] != state
	if note != "" {
		reason, msg = ReasonInvalidSettings, note
		stale = stale || !conditionSays(pod, reason, msg)
	}
	if outcome == "repaired" || stale || now.Sub(m.published) >= a.cfg.StatusRefresh {
		if err := a.publish(ctx, pod, state, true, reason, msg, now); err == nil {
			m.published = now
		}
	}
}

// conditionSays reports whether the pod's Enrolled condition has this
// reason and message.
func conditionSays(pod *corev1.Pod, reason, message string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == ConditionEnrolled {
			return c.Reason == reason && c.Message == message
		}
	}
	return false
}

// verifyHost rewrites the host probe rules when they drifted. Enrollments
// change the set meanwhile, without a lock: a difference seen while one
// was writing is no drift, and a rewrite during which one did may have
// missed it, and is done again. With writes in flight at every try, the
// next pass checks.
func (a *Agent) verifyHost() {
	for range 3 {
		ips, gen, writing := a.probes()
		if writing {
			continue
		}
		problems, err := a.host.Verify(ips)
		if err == nil && len(problems) == 0 {
			return
		}
		if a.probeGeneration() != gen {
			continue // an enrollment moved under the check
		}
		a.log.Warn("host probe rules drifted; rewriting", "problems", problems, "err", err)
		a.metrics.hostRepairs.Inc()
		if err := a.host.Sync(ips); err != nil {
			a.log.Error("cannot rewrite host probe rules", "err", err)
			return
		}
		if a.probeGeneration() == gen {
			return
		}
	}
}

// Delivered marks a pod the node proxy took (in a ZDS snapshot, after it
// waited as pending): its DNS capture goes on now, and the next pass
// publishes it enabled. The ZDS server calls it with its own lock held,
// possibly inside enrollPod, so it only hands the news to a goroutine.
func (a *Agent) Delivered(uid string) {
	go func() {
		unlock := a.locks.lock(types.UID(uid))
		m := a.memberOf(types.UID(uid))
		changed := m != nil && (m.state != enroll.RedirectionEnabled || !m.served)
		if changed {
			m.state = enroll.RedirectionEnabled
			if err := a.proxyServes(m); err != nil {
				// m.served is set: the next pass holds the netns to
				// m.rules() and repairs it.
				a.log.Warn("cannot put the pod's rules in place for its node proxy", "pod", m.namespace+"/"+m.name, "err", err)
			}
		}
		unlock()
		if changed {
			a.poke()
		}
	}()
}

// proxyServes records that a node proxy serves m and puts in place the DNS
// capture that waited for it. Callers hold the pod's lock.
func (a *Agent) proxyServes(m *member) error {
	before := m.rules()
	m.served = true
	if m.rules().Equal(before) {
		return nil
	}
	if err := a.backend.Enroll(m.path(), m.rules()); err != nil {
		return fmt.Errorf("turn on dns capture: %w", err)
	}
	return nil
}
