package agent

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect"
)

// SelfTest enrolls a throwaway network namespace with the agent's backend,
// verifies it and un-enrolls it: what a pod's enrollment does inside the
// pod, on this node's kernel. With sidecar capture on, it then installs a
// sidecar pod's default capture in the same namespace and verifies that
// too (its owner matches need kernel support ambient rules do not). The
// namespace is never pinned; it goes when SelfTest returns.
//
// A node whose kernel cannot guard the node proxy's ports
// (redirect.Unguardable) refuses every ambient pod, each with the reason,
// but must still run sidecar pods and pods outside the mesh: its
// self-test checks the ambient rules without the guard and passes, so the
// node loses its startup taint, and says that ambient pods are refused.
func (a *Agent) SelfTest() error {
	backend := a.backend
	if g, ok := a.backend.(interface {
		Unguardable() error
		Unwrap() redirect.Backend
	}); ok {
		if err := g.Unguardable(); err != nil {
			a.log.Warn("self-test without the port guard: this node refuses every ambient pod; sidecar pods and pods outside the mesh run", "err", err)
			backend = g.Unwrap()
		}
	}
	f, err := throwawayNetns()
	if err != nil {
		return fmt.Errorf("self-test: %w", err)
	}
	defer f.Close()
	// Guarded like a pod's, which no pass may forget meanwhile.
	defer a.beginEnrolling(f)()
	path := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	cfgs := []redirect.PodConfig{a.cfg.selfTestPod()}
	if a.cfg.Enroll.SidecarCapture {
		cfgs = append(cfgs, redirect.PodConfig{Sidecar: redirect.DefaultSidecarConfig()})
	}
	var verr error
	for _, cfg := range cfgs {
		if err := backend.Enroll(path, cfg); err != nil {
			verr = fmt.Errorf("enroll %s: %w", modeOf(cfg), err)
			break
		}
		if err := backend.Verify(path, cfg); err != nil {
			verr = fmt.Errorf("verify %s: %w", modeOf(cfg), err)
			break
		}
	}
	if uerr := backend.Unenroll(path); verr != nil || uerr != nil {
		return fmt.Errorf("self-test: %w", errors.Join(verr, uerr))
	}
	return nil
}

// throwawayNetns returns a handle on a new network namespace with its
// loopback up, as a pod's is.
func throwawayNetns() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	c := make(chan result, 1)
	go func() {
		// The thread stays locked and dies with the goroutine: no other
		// goroutine ever runs in the new namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- result{err: fmt.Errorf("new network namespace: %w", err)}
			return
		}
		f, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		c <- result{f, err}
	}()
	r := <-c
	if r.err != nil {
		return nil, r.err
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(r.f.Fd()))
	if err != nil {
		r.f.Close()
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		r.f.Close()
		return nil, fmt.Errorf("loopback up: %w", err)
	}
	return r.f, nil
}
