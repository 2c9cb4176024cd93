package redirect

import (
	"errors"
	"fmt"
)

// NetnsGuard guards the node proxy's ports in a pod's network namespace;
// *PortGuard implements it.
type NetnsGuard interface {
	Guard(netnsPath string) error
	Unguard(netnsPath string) error
	// Problems compares the namespace with Guard's result when want,
	// with an unguarded namespace otherwise.
	Problems(netnsPath string, want bool) ([]string, error)
}

// Guarded is a Backend (any of the three) whose ambient pods have the
// node proxy's ports guarded (PortGuard): Enroll guards the namespace
// before the backend installs anything, so no process of the pod can
// bind them by the time traffic is redirected there, nor before the node
// proxy opens its listeners. A sidecar pod is unguarded instead (its own
// Envoy binds 15001 and 15006), after its capture is in. Verify reports a
// guard that differs as drift, Unenroll unguards last.
type Guarded struct {
	Backend
	Guard NetnsGuard
}

// Unwrap returns the backend the guard wraps, for callers that look for
// what a backend can do besides Backend (agent.SocketBackend).
func (g Guarded) Unwrap() Backend { return g.Backend }

// Enroll implements Backend.
func (g Guarded) Enroll(netnsPath string, cfg PodConfig) error {
	if cfg.Sidecar != nil {
		if err := g.Backend.Enroll(netnsPath, cfg); err != nil {
			return err
		}
		return g.Guard.Unguard(netnsPath)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := g.Guard.Guard(netnsPath); err != nil {
		return err
	}
	return g.Backend.Enroll(netnsPath, cfg)
}

// Verify implements Backend.
func (g Guarded) Verify(netnsPath string, cfg PodConfig) error {
	err := g.Backend.Verify(netnsPath, cfg)
	var drift *DriftError
	if err != nil && !errors.As(err, &drift) {
		return err
	}
	problems, perr := g.Guard.Problems(netnsPath, cfg.Sidecar == nil)
	if perr != nil {
		return perr
	}
	if len(problems) == 0 {
		return err
	}
	if drift == nil {
		drift = &DriftError{}
	}
	drift.Problems = append(drift.Problems, problems...)
	return drift
}

// Unenroll implements Backend.
func (g Guarded) Unenroll(netnsPath string) error {
	if err := g.Backend.Unenroll(netnsPath); err != nil {
		return err
	}
	return g.Guard.Unguard(netnsPath)
}

// Unguardable reports why the node cannot guard (the Unguardable guard's
// Err), nil when it can: what the agent's self-test must not fail the
// node for, since it refuses only ambient pods.
func (g Guarded) Unguardable() error {
	if u, ok := g.Guard.(Unguardable); ok {
		return u.Err
	}
	return nil
}

// PruneGuards forgets the guarded namespaces whose inode is not in live,
// when the guard can (PortGuard.Prune).
func (g Guarded) PruneGuards(live []uint64) (int, error) {
	p, ok := g.Guard.(interface {
		Prune(live []uint64) (int, error)
	})
	if !ok {
		return 0, nil
	}
	return p.Prune(live)
}

// RemoveGuard takes the guard off the node, when it can
// (PortGuard.Remove): for an agent uninstalled, once every pod is out.
func (g Guarded) RemoveGuard() error {
	r, ok := g.Guard.(interface{ Remove() error })
	if !ok {
		return nil
	}
	if err := r.Remove(); err != nil {
		return fmt.Errorf("remove the port guard: %w", err)
	}
	return nil
}

// ErrNoPortGuard is an ambient pod refused because the node cannot guard
// its node proxy's ports (Unguardable).
var ErrNoPortGuard = errors.New("the node proxy's ports in pods cannot be guarded on this node")

// Unguardable is the NetnsGuard of a node where OpenPortGuard failed:
// every ambient pod is refused, with Err saying why, rather than
// enrolled with ports a process of the pod could take. Sidecar pods,
// which need no guard, are enrolled as usual.
type Unguardable struct{ Err error }

// Guard implements NetnsGuard: it refuses.
func (u Unguardable) Guard(string) error { return fmt.Errorf("%w: %w", ErrNoPortGuard, u.Err) }

// Unguard implements NetnsGuard: nothing is guarded.
func (Unguardable) Unguard(string) error { return nil }

// Problems implements NetnsGuard.
func (u Unguardable) Problems(_ string, want bool) ([]string, error) {
	if want {
		return []string{u.Guard("").Error()}, nil
	}
	return nil, nil
}
