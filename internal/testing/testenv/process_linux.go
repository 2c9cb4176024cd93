package testenv

import "syscall"

// sysProcAttr puts each component in its own process group. Attached
// components die with the test binary (the kernel kills them), so a crashed
// or timed-out test leaves no etcd or API server behind; detached ones get a
// session of their own and outlive their starter.
func sysProcAttr(detached bool) *syscall.SysProcAttr {
	if detached {
		return &syscall.SysProcAttr{Setsid: true}
	}
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
