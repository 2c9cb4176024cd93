package redirect

import "errors"

// LeavingEbpf is a netfilter backend (Nftables or Iptables) on a node whose
// pods may still carry the eBPF backend's state: the agent ran there with
// --backend=ebpf before, and that state outlives it by design. Enroll puts
// the backend's rules in first and then removes the eBPF routing,
// programs and pins, so a pod changing over is captured twice for a
// moment, never not at all (netfilter's REDIRECT to loopback is left alone
// by the eBPF programs). Verify counts eBPF state left in a pod as drift,
// which the next Enroll removes.
type LeavingEbpf struct {
	Backend
	// Root is where the eBPF backend pinned (its Ebpf.Root).
	Root string
}

// Enroll implements Backend.
func (l LeavingEbpf) Enroll(netnsPath string, cfg PodConfig) error {
	if err := l.Backend.Enroll(netnsPath, cfg); err != nil {
		return err
	}
	return Ebpf{Root: l.Root}.removeEbpf(netnsPath)
}

// Verify implements Backend.
func (l LeavingEbpf) Verify(netnsPath string, cfg PodConfig) error {
	return verifyWithout(l.Backend, Ebpf{Root: l.Root}, netnsPath, cfg)
}

// Unenroll implements Backend.
func (l LeavingEbpf) Unenroll(netnsPath string) error {
	return errors.Join(Ebpf{Root: l.Root}.removeEbpf(netnsPath), l.Backend.Unenroll(netnsPath))
}
