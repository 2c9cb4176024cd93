package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
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
func (a *Agent) reconcile(ctx context.Context) {
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		a.log.Error("list pods", "err", err)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[types.UID]bool{}
	unenrollable := 0
	for _, pod := range pods {
		m := a.enrolled[pod.UID]
		d := a.decide(pod)
		if !d.Enroll || !running(pod) {
			if m != nil {
				a.unenrollPod(ctx, m, pod)
			}
			continue
		}
		seen[pod.UID] = true
		ips := podIPs(pod)
		if len(ips) == 0 {
			continue // not networked yet: the plugin's ADD comes first
		}
		if m == nil {
			if !a.enrollRunning(ctx, pod, ips, d.Pod) {
				unenrollable++
			}
			continue
		}
		a.verify(ctx, pod, m, ips, d.Pod)
	}
	for uid, m := range a.enrolled {
		if !seen[uid] {
			a.unenrollPod(ctx, m, nil)
		}
	}
	a.metrics.unenrollable.Set(float64(unenrollable))
	a.verifyHost()
}

// enrollRunning enrolls a pod that runs without the agent having seen its
// ADD: started before the agent, or while the plugin was missing from the
// CNI configuration. Its netns is found by its IP.
func (a *Agent) enrollRunning(ctx context.Context, pod *corev1.Pod, ips []netip.Addr, cfg redirect.PodConfig) bool {
	path, err := a.finder.find(ips[0])
	if err != nil || path == "" {
		msg := fmt.Sprintf("no network namespace on this node holds the pod's IP %s", ips[0])
		if err != nil {
			msg = err.Error()
		}
		a.log.Warn("cannot enroll running pod", "pod", pod.Namespace+"/"+pod.Name, "reason", msg)
		if perr := a.publish(ctx, pod, "", false, ReasonNoNetns, msg, a.cfg.Now()); perr != nil {
			a.log.Warn("cannot publish", "err", perr)
		}
		return false
	}
	return a.enrollPod(ctx, pod, path, ips, cfg) == nil
}

// verify checks an enrolled pod against the kernel and repairs it.
func (a *Agent) verify(ctx context.Context, pod *corev1.Pod, m *member, ips []netip.Addr, cfg redirect.PodConfig) {
	key := pod.Namespace + "/" + pod.Name
	// A pod whose sandbox was recreated has a new netns: the old handle
	// no longer holds its IP.
	if !holds(m.path(), ips[0]) {
		a.metrics.verifications.WithLabelValues("netns_replaced").Inc()
		a.log.Warn("pod's network namespace was replaced; enrolling the new one", "pod", key)
		a.enrollRunning(ctx, pod, ips, cfg)
		return
	}
	outcome, reason := "verified", ReasonVerified
	err := a.backend.Verify(m.path(), cfg)
	var drift *redirect.DriftError
	switch {
	case err == nil && sameConfig(m.cfg, cfg):
	case err == nil || errors.As(err, &drift):
		// Drifted behind the agent's back, or the pod's settings changed.
		a.log.Warn("pod's redirection differs from its rules; repairing", "pod", key, "drift", err)
		if rerr := a.backend.Enroll(m.path(), cfg); rerr != nil {
			a.metrics.verifications.WithLabelValues("failed").Inc()
			_ = a.publish(ctx, pod, "", false, ReasonFailed, rerr.Error(), a.cfg.Now())
			return
		}
		m.cfg = cfg
		outcome, reason = "repaired", ReasonRepaired
	default:
		a.metrics.verifications.WithLabelValues("failed").Inc()
		a.log.Error("cannot verify pod", "pod", key, "err", err)
		return
	}
	a.metrics.verifications.WithLabelValues(outcome).Inc()
	now := a.cfg.Now()
	m.verified = now
	state := m.state
	if state == enroll.RedirectionPending {
		reason = ReasonPending
	}
	if outcome == "repaired" || pod.Annotations[enroll.AnnotationRedirection] != state || now.Sub(m.published) >= a.cfg.StatusRefresh {
		if err := a.publish(ctx, pod, state, true, reason, "redirection verified in the pod's network namespace", now); err == nil {
			m.published = now
		}
	}
}

// verifyHost rewrites the host probe rules when they drifted.
func (a *Agent) verifyHost() {
	var ips []netip.Addr
	for _, m := range a.enrolled {
		ips = append(ips, m.ips...)
	}
	problems, err := a.host.Verify(ips)
	if err == nil && len(problems) == 0 {
		return
	}
	a.log.Warn("host probe rules drifted; rewriting", "problems", problems, "err", err)
	a.metrics.hostRepairs.Inc()
	if err := a.host.Sync(ips); err != nil {
		a.log.Error("cannot rewrite host probe rules", "err", err)
	}
}

// Delivered marks a pod the node proxy took (in a ZDS snapshot, after it
// waited as pending): the next pass publishes it enabled. The ZDS server
// calls it with its own lock held, possibly inside enrollPod, so it only
// hands the news to a goroutine.
func (a *Agent) Delivered(uid string) {
	go func() {
		a.mu.Lock()
		m := a.enrolled[types.UID(uid)]
		changed := m != nil && m.state != enroll.RedirectionEnabled
		if changed {
			m.state = enroll.RedirectionEnabled
		}
		a.mu.Unlock()
		if changed {
			a.poke()
		}
	}()
}
