package hbone

import (
	"fmt"
	"io"
	"syscall"
)

// canReadReady: readReady works here.
const canReadReady = true

// readReady reads what the app's socket holds into a pooled buffer,
// waiting first, without a buffer, until it holds something: an idle
// connection holds none. RawConn.Read waits for the poller whenever the
// function returns false, which it does when the read finds nothing (the
// poller reports what arrives after that read). The buffer goes back to
// readBuffers once its n bytes are used.
func (k *appSink) readReady() (buf *[]byte, n int, err error) {
	if k.readFn == nil {
		k.readFn = func(fd uintptr) bool {
			b := readBuffers.Get().(*[]byte)
			for {
				n, err := syscall.Read(int(fd), *b)
				switch {
				case err == syscall.EINTR:
					continue
				case err == syscall.EAGAIN:
					readBuffers.Put(b)
					return false
				}
				k.rbuf, k.rn, k.rerr = b, max(n, 0), err
				return true
			}
		}
	}
	if err := k.rc.Read(k.readFn); err != nil {
		return nil, 0, err
	}
	buf, n, err = k.rbuf, k.rn, k.rerr
	k.rbuf, k.rerr = nil, nil
	switch {
	case err != nil:
		err = fmt.Errorf("hbone: read the app's socket: %w", err)
	case n == 0:
		err = io.EOF
	}
	return buf, n, err
}
