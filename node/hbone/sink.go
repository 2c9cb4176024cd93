package hbone

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
)

// An idle tunnelled connection should cost its end of the tunnel next to
// nothing (TestIdleStreamsAreCheap): no buffer and at most one goroutine.
// Splice between a TCP socket and a stream therefore runs the stream's
// direction without a goroutine of its own:
//
//   - the read loop writes received DATA to the app's socket itself, with
//     one non-blocking write, when nothing is queued before it: no
//     hand-off to another goroutine, which is most of a small exchange's
//     latency on a busy machine;
//   - what the socket does not take at once (the app reads slowly), and
//     the stream's end, are queued as before and written by a goroutine
//     started for them, which ends when the queue is empty.
//
// The read loop still never blocks on a write: the socket's write is
// non-blocking, and the window updates for bytes it wrote go through the
// control queue.

// appSink is the app's socket a stream's received bytes go to.
type appSink struct {
	conn *net.TCPConn
	rc   syscall.RawConn
	// busy is set while a goroutine drains the queue or the read loop
	// writes, finished once the direction has ended; both are guarded by
	// the stream's rmu.
	busy, finished bool
	// written counts the bytes written to conn.
	written atomic.Int64
	err     error         // why the direction ended (nil: the stream's end)
	done    chan struct{} // closed when the direction has ended

	// The non-blocking write's argument and result, and the function
	// RawConn.Write runs, made once: a closure per write would allocate.
	wbuf    []byte
	wn      int
	writeFn func(fd uintptr) bool
	// readReady's function, made on first use, and its results.
	readFn func(fd uintptr) bool
	rbuf   *[]byte
	rn     int
	rerr   error
}

// errNoSink: the connection cannot be a sink here.
var errNoSink = errors.New("hbone: no bufferless wait on this platform")

func newAppSink(c *net.TCPConn) (*appSink, error) {
	if !canReadReady {
		return nil, errNoSink
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	k := &appSink{conn: c, rc: rc, done: make(chan struct{})}
	k.writeFn = func(fd uintptr) bool {
		n, _ := syscall.Write(int(fd), k.wbuf)
		k.wn = max(n, 0)
		return true // one attempt: the read loop does not wait
	}
	return k, nil
}

// tryWrite writes what the socket takes of p now, without waiting;
// callers hold the stream's rmu with the sink not busy, so no other
// write to the socket runs.
func (k *appSink) tryWrite(p []byte) int {
	k.wbuf, k.wn = p, 0
	if err := k.rc.Write(k.writeFn); err != nil {
		k.wn = 0
	}
	k.wbuf = nil
	k.written.Add(int64(k.wn))
	return k.wn
}

// attachSink makes k the destination of s's received bytes; bytes
// queued before are written first.
func (s *Stream) attachSink(k *appSink) {
	s.rmu.Lock()
	s.sink = k
	start := s.kickSinkLocked()
	s.rmu.Unlock()
	if start {
		go s.drainSink()
	}
}

// kickSinkLocked reports whether a goroutine must start to write queued
// bytes to the sink, and marks the sink busy if so. With nothing queued,
// it ends the sink's direction at the stream's end or error here: a
// shutdown does not block, and a goroutine per stream end would cost
// each new connection. Callers hold rmu.
func (s *Stream) kickSinkLocked() bool {
	k := s.sink
	if k == nil || k.busy || k.finished {
		return false
	}
	if s.rlen == 0 {
		if err, end := s.sinkEndLocked(); end {
			s.finishSinkLocked(err)
		}
		return false
	}
	k.busy = true
	return true
}

// sinkEndLocked reports whether the sink's direction ends once the
// queue is written, and with what error (nil: the stream's end).
// Callers hold rmu.
func (s *Stream) sinkEndLocked() (error, bool) {
	switch {
	case s.rdl.expired:
		return &timeoutError{op: "read", stream: s.id}, true
	case s.rerr != nil:
		return s.rerr, true
	}
	return nil, s.rEOF
}

// writeThroughLocked writes received bytes straight to the sink when
// nothing waits before them (read loop; callers hold rmu): it returns
// how many the socket took, and the stream WINDOW_UPDATE now due for
// them.
func (s *Stream) writeThroughLocked(data []byte) (n int, inc uint32) {
	k := s.sink
	if k == nil || k.busy || k.finished || s.rlen > 0 || s.rerr != nil || s.rdl.expired || len(data) == 0 {
		return 0, 0
	}
	n = k.tryWrite(data)
	return n, uint32(s.creditLocked(int64(n)))
}

// drainSink writes the queued bytes to the sink until none is left, and
// ends the direction at the stream's end or error.
func (s *Stream) drainSink() {
	k := s.sink
	for {
		s.rmu.Lock()
		if s.rlen == 0 || s.rdl.expired {
			if err, end := s.sinkEndLocked(); end {
				s.finishSinkLocked(err)
			} else {
				// Written out: the read loop writes the next bytes.
				k.busy = false
			}
			s.rmu.Unlock()
			return
		}
		ch := s.popLocked()
		s.rmu.Unlock()
		data := ch.b[ch.off:]
		n, err := k.conn.Write(data)
		k.written.Add(int64(n))
		ch.release()
		s.credit(int64(len(data)))
		if err != nil {
			s.rmu.Lock()
			s.finishSinkLocked(err)
			s.rmu.Unlock()
			return
		}
	}
}

// finishSinkLocked ends the stream's direction: the app reads EOF.
// Callers hold rmu.
func (s *Stream) finishSinkLocked(err error) {
	k := s.sink
	k.finished, k.busy, k.err = true, false, err
	_ = k.conn.CloseWrite()
	close(k.done)
}
