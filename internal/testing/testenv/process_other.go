//go:build !linux

package testenv

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent's.
func sysProcAttr(detached bool) *syscall.SysProcAttr {
	if detached {
		return &syscall.SysProcAttr{Setsid: true}
	}
	return &syscall.SysProcAttr{Setpgid: true}
}
