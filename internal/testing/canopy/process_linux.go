package canopy

import "syscall"

// sysProcAttr gives the controller a process group of its own and has the
// kernel kill it when the test binary dies, so a crashed test or benchmark
// leaves none behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
