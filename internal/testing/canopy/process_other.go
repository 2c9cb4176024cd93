//go:build !linux

package canopy

import "syscall"

// sysProcAttr gives the controller a process group of its own.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
