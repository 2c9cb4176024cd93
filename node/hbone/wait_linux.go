package hbone

import (
	"syscall"
	"unsafe"
)

// canWaitReadable: waitReadable works here.
const canWaitReadable = true

// waitReadable waits until the app's socket has bytes, its end or an
// error to read, holding no buffer meanwhile. RawConn.Read waits for the
// poller whenever the function returns false; the function peeks, since
// the poller only reports readiness that arrives after it was asked.
func (k *appSink) waitReadable() error {
	if k.peekFn == nil {
		k.peekFn = func(fd uintptr) bool {
			_, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&k.peek[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			// Bytes, the end (0) or an error: the next Read says which.
			return errno != syscall.EAGAIN
		}
	}
	return k.rc.Read(k.peekFn)
}
