package redirect

import "errors"

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
