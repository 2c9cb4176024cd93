//go:build !linux

package istiod

import "syscall"

// sysProcAttr gives istiod a process group of its own.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
