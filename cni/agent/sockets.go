package agent

import (
	"slices"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// SocketBackend is a backend that steers a pod's traffic to the node
// proxy's sockets in the pod's socket map rather than to ports
// (redirect.Ebpf). The proxy fills the map itself; the agent can only say
// when it has not.
type SocketBackend interface {
	// Unregistered lists the pod's empty slots; an error for a pod the
	// backend redirects another way (one it delegated to nftables).
	Unregistered(netnsPath string) ([]sockmap.Slot, error)
	// RemoveStaleDirs removes the pins of pods whose namespaces are gone
	// and not in live.
	RemoveStaleDirs(live []uint64) ([]uint64, error)
}

// GuardBackend is a backend that guards the node proxy's ports in its
// ambient pods (redirect.Guarded).
type GuardBackend interface {
	// PruneGuards forgets the guarded namespaces whose inode is not in
	// live.
	PruneGuards(live []uint64) (int, error)
	// RemoveGuard takes the guard off the node, once no pod is enrolled.
	RemoveGuard() error
}

// socketBackend is the agent's backend as a SocketBackend, if it is one
// under the wrappers it may be in (redirect.Guarded).
func (a *Agent) socketBackend() (SocketBackend, bool) {
	b := a.backend
	for {
		if sb, ok := b.(SocketBackend); ok {
			return sb, true
		}
		w, ok := b.(interface{ Unwrap() redirect.Backend })
		if !ok {
			return nil, false
		}
		b = w.Unwrap()
	}
}

// checkSockets records which of a served ambient pod's slots its node
// proxy has not filled, and logs when that changes. An empty slot drops
// the traffic that belongs to it (fail closed), so a pod listed here is
// cut off from the mesh in that direction: a node proxy that does not
// fill socket maps (not Canopy's), or one that cannot see the node's BPF
// filesystem. DNS slots count only while the pod's DNS is captured.
// Callers hold the pod's lock.
func (a *Agent) checkSockets(m *member) {
	sb, ok := a.socketBackend()
	if !ok || m.sidecar() {
		return
	}
	var missing []sockmap.Slot
	if m.served {
		slots, err := sb.Unregistered(m.path())
		if err != nil {
			slots = nil // not redirected through a socket map
		}
		dns := m.rules().DNSCapture
		for _, s := range slots {
			if dns || (s != sockmap.DNSTCP && s != sockmap.DNSUDP) {
				missing = append(missing, s)
			}
		}
	}
	if slices.Equal(missing, m.unregistered) {
		return
	}
	key := m.namespace + "/" + m.name
	if len(missing) > 0 {
		a.log.Warn("the node proxy has not put its sockets in the pod's socket map: the pod's traffic to them is dropped", "pod", key, "slots", missing)
	} else {
		a.log.Info("the node proxy's sockets are in the pod's socket map", "pod", key)
	}
	m.unregistered = missing
}

// collectPins removes the pins of pods that went away while no agent ran
// (their Unenroll never came), and forgets their namespaces in the port
// guard.
func (a *Agent) collectPins() {
	// The enrollments under way are read first and held off until the
	// pruning is done: one that ended since is a member below, one that
	// starts after guards its namespace after the pruning (beginEnrolling).
	a.enrollingMu.Lock()
	var live []uint64
	for ino := range a.enrolling {
		live = append(live, ino)
	}
	unregistered := 0
	for _, m := range a.members() {
		if ino, err := sockmap.Inode(m.netns); err == nil {
			live = append(live, ino)
		}
		if len(m.unregistered) > 0 {
			unregistered++
		}
	}
	if gb, ok := a.backend.(GuardBackend); ok {
		n, err := gb.PruneGuards(live)
		if err != nil {
			a.log.Warn("cannot forget the guarded namespaces of pods that are gone", "err", err)
		}
		if n > 0 {
			a.log.Info("forgot the guarded namespaces of pods that are gone", "count", n)
		}
	}
	a.enrollingMu.Unlock()
	sb, ok := a.socketBackend()
	if !ok {
		return
	}
	a.metrics.unregistered.Set(float64(unregistered))
	removed, err := sb.RemoveStaleDirs(live)
	if err != nil {
		a.log.Warn("cannot remove the pins of pods that are gone", "err", err)
	}
	if len(removed) > 0 {
		a.log.Info("removed the pins of pods that are gone", "netns_inodes", removed)
	}
}
