package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// enrollPod puts a pod in the mesh (docs/wire-contract.md §3.5): rules in its
// netns, its IPs in the host probe set, the pod to the node proxy, the
// annotation; a sidecar pod gets its capture only (enrollSidecar). f is a
// handle on the pod's network namespace, which enrollPod owns from then
// on; source says where it came from, for the log. Callers hold the pod's
// lock (locks.go).
//
// A failed enrollment leaves nothing of the pod in ZDS: a node proxy must
// never serve a pod the agent could not enroll, so the ZDS server forgets
// it (closing its handle on the netns) and every node proxy is told.
func (a *Agent) enrollPod(ctx context.Context, pod *corev1.Pod, f *os.File, source string, adopted bool, ips []netip.Addr, cfg redirect.PodConfig) error {
	defer a.beginEnrolling(f)()
	// A pod that changes mode leaves the old one entirely first: the node
	// proxy, the probe set and the annotation are ambient's only.
	if old := a.memberOf(pod.UID); old != nil && old.sidecar() != (cfg.Sidecar != nil) {
		a.unenrollPod(ctx, old, pod)
	}
	if cfg.Sidecar != nil {
		return a.enrollSidecar(ctx, pod, f, source, ips, cfg)
	}
	// inZDS: the ZDS server may hold the pod, from an earlier enrollment
	// or from this one. probed: its IPs are in the host probe set.
	inZDS, probed := false, false
	// served: a node proxy serves the pod already. An adopted pod
	// annotated enabled was taken by a node proxy from an earlier agent,
	// and node proxies keep their pods while the agent is away: its DNS
	// capture stays, with no moment without it. A pod this agent held
	// before (a replaced netns, a repeated ADD) waits for a new ack: the
	// proxy served its old namespace, not this one.
	served := adopted && pod.Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled
	if old := a.dropMember(pod.UID); old != nil {
		old.netns.Close()
		_ = a.removeProbes(old.ips)
		inZDS, served = true, false
	}
	fail := func(err error) error {
		f.Close()
		if probed {
			_ = a.removeProbes(ips)
		}
		if inZDS {
			if derr := a.proxy.Delete(string(pod.UID)); derr != nil {
				err = errors.Join(err, fmt.Errorf("withdraw from the node proxy: %w", derr))
			}
		}
		return a.failed(ctx, pod, modeAmbient, err)
	}
	m := &member{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, netns: f, ips: ips, cfg: cfg, served: served}
	// The rules go in before the node proxy hears of the pod, without DNS
	// capture unless a proxy serves it already (phased): its DNS goes to
	// its resolvers until a proxy acknowledges it. An adopted pod whose
	// rules are as they should be keeps them untouched: rewriting them is
	// a needless moment of kernel churn in a pod that carries traffic.
	if !adopted || a.backend.Verify(m.path(), m.rules()) != nil {
		if err := a.backend.Enroll(m.path(), m.rules()); err != nil {
			return fail(err)
		}
	}
	if err := a.addProbes(ips); err != nil {
		return fail(fmt.Errorf("host probe set: %w", err))
	}
	probed = true
	state, reason := enroll.RedirectionEnabled, ReasonVerified
	inZDS = true
	err := a.proxy.Add(zds.Pod{UID: string(pod.UID), Info: workloadInfo(pod), Netns: dup(f)})
	switch {
	case err == nil:
		// The ack says the proxy's listeners in the pod are open, 15053
		// included: its DNS may go there now.
		if err := a.proxyServes(m); err != nil {
			return fail(err)
		}
	case !errors.Is(err, zds.ErrNoProxy):
		// Rules stay: traffic fails closed inside the pod.
		return fail(fmt.Errorf("node proxy: %w", err))
	default:
		// No proxy yet: the pod waits, DNS uncaptured, until a snapshot
		// delivers it (Delivered).
		state, reason = enroll.RedirectionPending, ReasonPending
		if adopted && pod.Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled {
			// A node proxy took the pod from an earlier agent, and node
			// proxies keep their pods while the agent is away: it still
			// serves them, and takes them again from this agent's ZDS
			// snapshot. Saying pending now would flip the pod's workload
			// from HBONE to plain TCP in every node proxy of the mesh
			// for the length of an agent restart, and back.
			state, reason = enroll.RedirectionEnabled, ReasonVerified
		}
	}
	now := a.cfg.Now()
	m.state, m.verified, m.published = state, now, now
	a.putMember(m)
	a.metrics.enrollments.WithLabelValues(state, modeAmbient).Inc()
	a.log.Info("pod enrolled", "pod", pod.Namespace+"/"+pod.Name, "mode", modeAmbient, "state", state, "netns", source)
	msg := "redirection verified in the pod's network namespace"
	if state == enroll.RedirectionPending {
		msg = "redirection in place; no node proxy has taken the pod yet"
	}
	if err := a.publish(ctx, pod, state, true, reason, msg, now); err != nil {
		a.log.Warn("cannot publish enrollment", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	return nil
}

// enrollSidecar installs a sidecar pod's capture in its netns. Called
// within the pod's CNI ADD, it is in place before any of the pod's
// containers runs. Nothing goes to the node proxy or the host probe set:
// the pod's own Envoy takes its traffic, and the kubelet's probes reach
// pilot-agent's status port, which is never captured. The pod gets the
// Enrolled condition but not the ambient redirection annotation, which
// would tell the mesh to send it HBONE.
func (a *Agent) enrollSidecar(ctx context.Context, pod *corev1.Pod, f *os.File, source string, ips []netip.Addr, cfg redirect.PodConfig) error {
	if old := a.dropMember(pod.UID); old != nil {
		old.netns.Close()
	}
	m := &member{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, netns: f, ips: ips, cfg: cfg}
	if err := a.backend.Enroll(m.path(), cfg); err != nil {
		f.Close()
		return a.failed(ctx, pod, modeSidecar, err)
	}
	now := a.cfg.Now()
	m.verified, m.published = now, now
	a.putMember(m)
	a.metrics.enrollments.WithLabelValues(enroll.RedirectionEnabled, modeSidecar).Inc()
	a.log.Info("pod enrolled", "pod", pod.Namespace+"/"+pod.Name, "mode", modeSidecar, "netns", source)
	if err := a.publish(ctx, pod, "", true, ReasonVerified, "sidecar capture in place in the pod's network namespace", now); err != nil {
		a.log.Warn("cannot publish enrollment", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	return nil
}

// failed records and publishes a failed enrollment in mode.
func (a *Agent) failed(ctx context.Context, pod *corev1.Pod, mode string, err error) error {
	a.metrics.enrollments.WithLabelValues("failed", mode).Inc()
	a.log.Error("cannot enroll pod", "pod", pod.Namespace+"/"+pod.Name, "mode", mode, "err", err)
	if perr := a.publish(ctx, pod, "", false, ReasonFailed, err.Error(), a.cfg.Now()); perr != nil {
		a.log.Warn("cannot publish enrollment failure", "pod", pod.Namespace+"/"+pod.Name, "err", perr)
	}
	return err
}

// unenrollPod takes a pod out: rules, proxy, probe set, annotation (when
// the pod still exists). Partial state is tolerated. Callers hold the
// pod's lock, and m is its member.
func (a *Agent) unenrollPod(ctx context.Context, m *member, pod *corev1.Pod) {
	var errs []error
	if err := a.backend.Unenroll(m.path()); err != nil {
		errs = append(errs, err)
	}
	if !m.sidecar() {
		if err := a.proxy.Delete(string(m.uid)); err != nil {
			errs = append(errs, err)
		}
		if err := a.removeProbes(m.ips); err != nil {
			errs = append(errs, err)
		}
	}
	m.netns.Close()
	a.dropMember(m.uid)
	if pod != nil {
		if err := a.unpublish(ctx, pod); err != nil {
			errs = append(errs, err)
		}
	}
	a.log.Info("pod unenrolled", "pod", m.namespace+"/"+m.name, "mode", modeOf(m.cfg), "err", errors.Join(errs...))
}

func workloadInfo(pod *corev1.Pod) *zdspb.WorkloadInfo {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return &zdspb.WorkloadInfo{Name: pod.Name, Namespace: pod.Namespace, ServiceAccount: sa}
}

// dup returns a second handle on f's namespace for the ZDS server, which
// owns and closes it.
func dup(f *os.File) *os.File {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), f.Name())
}

// beginEnrolling counts an enrollment of the namespace f under way until
// the returned func is called, which must be after the pod became a
// member or failed: until then no pass forgets its guard (collectPins).
// It waits for a pass's pruning in progress, which takes a moment.
func (a *Agent) beginEnrolling(f *os.File) (done func()) {
	ino, err := sockmap.Inode(f)
	if err != nil {
		return func() {} // Enroll fails on the same handle
	}
	a.enrollingMu.Lock()
	defer a.enrollingMu.Unlock()
	if a.enrolling == nil {
		a.enrolling = map[uint64]int{}
	}
	a.enrolling[ino]++
	return func() {
		a.enrollingMu.Lock()
		defer a.enrollingMu.Unlock()
		if a.enrolling[ino]--; a.enrolling[ino] <= 0 {
			delete(a.enrolling, ino)
		}
	}
}
