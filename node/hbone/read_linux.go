package hbone

import (
	"fmt"
	"io"
	"net"
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

// awaitPeer waits, without a buffer, until raw has something to read or
// its read deadline passes: the server side of a TLS handshake takes its
// state (a tls.Conn, record buffers, the configuration's certificate)
// only once the peer has sent something. A MSG_PEEK of one byte leaves
// what arrived for the handshake. A connection that is not a socket
// (net.Pipe in tests) is not waited for.
func awaitPeer(raw net.Conn) error {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var rerr error
	var one [1]byte
	err = rc.Read(func(fd uintptr) bool {
		for {
			_, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch err {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			// Data, the peer's FIN (n is 0) or an error: the handshake
			// reads it.
			rerr = err
			return true
		}
	})
	if err != nil {
		return err
	}
	return rerr
}
