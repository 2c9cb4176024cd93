package agent

import (
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// How the agent's work is serialized. Nothing is held across I/O but a
// pod's own lock:
//
//   - Each pod has a lock (podLocks), held for everything the agent does to
//     that pod (enroll, verify, repair, un-enroll, with the netlink, ZDS and
//     API calls these take). Two pods never wait for each other: a CNI ADD
//     does not wait for a reconcile pass, only, at worst, for the pass's
//     work on the same pod.
//   - Agent.mu guards the tables shared between pods (who is enrolled, the
//     probe IPs the host set must hold) and is held only to read or change
//     them, never across I/O.
//   - The host probe set is written by many goroutines without a lock.
//     The check for drift (verifyHost) repairs only what it saw with no
//     write in flight and no change during the check, and a rewrite
//     during which an enrollment changed the set is done again.
//
//   - Agent.enrollingMu guards the enrollments under way, and is held
//     while a pass prunes the port guard, a map walk (collectPins).
//
// Lock order: a pod's lock, then Agent.enrollingMu, then Agent.mu.

// podLocks hands out one mutex per pod UID, kept only while in use.
type podLocks struct {
	mu    sync.Mutex
	locks map[types.UID]*podLock
}

type podLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks the pod's mutex and returns its unlock.
func (l *podLocks) lock(uid types.UID) (unlock func()) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[types.UID]*podLock{}
	}
	pl := l.locks[uid]
	if pl == nil {
		pl = &podLock{}
		l.locks[uid] = pl
	}
	pl.refs++
	l.mu.Unlock()
	pl.mu.Lock()
	return func() {
		pl.mu.Unlock()
		l.mu.Lock()
		if pl.refs--; pl.refs == 0 {
			delete(l.locks, uid)
		}
		l.mu.Unlock()
	}
}

// memberOf returns the pod's member, nil if it is not enrolled.
func (a *Agent) memberOf(uid types.UID) *member {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.enrolled[uid]
}

// memberNamed returns the enrolled pod namespace/name, if any.
func (a *Agent) memberNamed(namespace, name string) *member {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.enrolled {
		if m.namespace == namespace && m.name == name {
			return m
		}
	}
	return nil
}

// members returns the enrolled pods.
func (a *Agent) members() []*member {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*member, 0, len(a.enrolled))
	for _, m := range a.enrolled {
		out = append(out, m)
	}
	return out
}

// putMember records m as its pod's member.
func (a *Agent) putMember(m *member) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.enrolled[m.uid] = m
	a.countMembers()
}

// dropMember forgets the pod's member and returns it (nil if none).
func (a *Agent) dropMember(uid types.UID) *member {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.enrolled[uid]
	delete(a.enrolled, uid)
	a.countMembers()
	return m
}

// countMembers publishes the number of members by mode; a.mu is held.
func (a *Agent) countMembers() {
	n := map[string]int{modeAmbient: 0, modeSidecar: 0}
	for _, m := range a.enrolled {
		n[modeOf(m.cfg)]++
	}
	for mode, count := range n {
		a.metrics.enrolled.WithLabelValues(mode).Set(float64(count))
	}
}

// addProbes puts ips in the host probe set.
func (a *Agent) addProbes(ips []netip.Addr) error {
	a.mu.Lock()
	for _, ip := range ips {
		a.probeIPs[ip]++
	}
	a.probeGen++
	a.mu.Unlock()
	if err := a.writeProbes(func() error { return a.host.Add(ips...) }); err != nil {
		a.forgetProbes(ips)
		return err
	}
	return nil
}

// removeProbes takes ips out of the host probe set, but for those another
// pod holds too.
func (a *Agent) removeProbes(ips []netip.Addr) error {
	if gone := a.forgetProbes(ips); len(gone) > 0 {
		return a.writeProbes(func() error { return a.host.Remove(gone...) })
	}
	return nil
}

// writeProbes runs one write of the host probe set, counted as in flight.
func (a *Agent) writeProbes(write func() error) error {
	a.mu.Lock()
	a.probeWrites++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.probeWrites--
		a.probeGen++
		a.mu.Unlock()
	}()
	return write()
}

// forgetProbes takes ips out of the agent's view of the probe set and
// returns those no pod holds any more.
func (a *Agent) forgetProbes(ips []netip.Addr) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var gone []netip.Addr
	for _, ip := range ips {
		if a.probeIPs[ip]--; a.probeIPs[ip] <= 0 {
			delete(a.probeIPs, ip)
			gone = append(gone, ip)
		}
	}
	a.probeGen++
	return gone
}

// probes returns the IPs the host probe set must hold, the generation of
// that view, and whether a write of the set is in flight.
func (a *Agent) probes() ([]netip.Addr, uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]netip.Addr, 0, len(a.probeIPs))
	for ip := range a.probeIPs {
		out = append(out, ip)
	}
	return out, a.probeGen, a.probeWrites > 0
}

// probeGeneration is the generation of the probe set view.
func (a *Agent) probeGeneration() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.probeGen
}
