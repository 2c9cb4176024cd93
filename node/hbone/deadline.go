package hbone

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// deadline is one direction of a Stream's deadline. The direction's
// waiters wait on a condition under a lock; when the deadline passes, a
// timer marks it expired and wakes them. It is guarded by that lock.
type deadline struct {
	timer *time.Timer
	// gen changes with every set, so that a timer set for an earlier
	// deadline does nothing.
	gen     uint64
	expired bool
}

// set moves the deadline to t (zero: none). Callers hold mu, the lock
// of the waiters, whom wake (called with mu held) wakes.
func (d *deadline) set(t time.Time, mu sync.Locker, wake func()) {
	d.stop()
	d.gen++
	d.expired = false
	if t.IsZero() {
		return
	}
	wait := time.Until(t)
	if wait <= 0 {
		d.expired = true
		wake()
		return
	}
	gen := d.gen
	d.timer = time.AfterFunc(wait, func() {
		mu.Lock()
		defer mu.Unlock()
		if d.gen == gen {
			d.expired = true
			wake()
		}
	})
}

// stop stops the timer; callers hold the waiters' lock.
func (d *deadline) stop() {
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}

// timeoutError is a Stream operation past its deadline. As a net.Conn's,
// it is a net.Error whose Timeout is true, and it matches
// os.ErrDeadlineExceeded.
type timeoutError struct {
	op     string
	stream uint32
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("hbone: stream %d %s: %v", e.stream, e.op, os.ErrDeadlineExceeded)
}

// Timeout implements net.Error.
func (e *timeoutError) Timeout() bool { return true }

// Temporary implements net.Error.
func (e *timeoutError) Temporary() bool { return true }

func (e *timeoutError) Unwrap() error { return os.ErrDeadlineExceeded }

// SetDeadline implements net.Conn: past t, Read, Write, WriteTo and
// ReadFrom fail with an error matching os.ErrDeadlineExceeded, and those
// blocked return. A zero t means none. A Write blocked on the connection
// itself (the peer not reading it) ends with Limits.WriteTimeout
// instead.
func (s *Stream) SetDeadline(t time.Time) error {
	_ = s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// SetReadDeadline implements net.Conn: the deadline of Read and WriteTo.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.rdl.set(t, &s.rmu, s.wakeReaders)
	return nil
}

// wakeReaders wakes Read and WriteTo, and a Splice's sink, to a passed
// read deadline; callers hold rmu.
func (s *Stream) wakeReaders() {
	s.rcond.Broadcast()
	if s.kickSinkLocked() {
		go s.drainSink()
	}
}

// SetWriteDeadline implements net.Conn: the deadline of Write and
// ReadFrom's writes.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	s.wdl.set(t, &c.mu, c.cond.Broadcast)
	return nil
}
