package testenv

import "syscall"

// sysProcAttr puts each component in its own process group and has the
// kernel kill it when the test binary dies, so that a crashed or timed-out
// test leaves no etcd or API server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
