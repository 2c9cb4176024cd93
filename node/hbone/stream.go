package hbone

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
)

// Stream is one tunnelled TCP connection: Read and Write carry its bytes,
// CloseWrite ends our direction (END_STREAM), Close ends both.
type Stream struct {
	c  *conn
	id uint32
	// Request is the CONNECT the client sent (server side).
	Request Request

	// Client side: the response.
	response   chan struct{}
	status     int
	respHeader map[string]string
	gotResp    bool

	// sendWindow and wdl are guarded by c.mu.
	sendWindow int64
	werr       error
	wdl        deadline

	rmu   sync.Mutex
	rcond *sync.Cond
	rdl   deadline
	// rq holds received bytes in pooled chunks; an idle stream holds none.
	rq      []*chunk
	rq0     [1]*chunk // rq's first backing array: a queue of one allocates nothing
	rlen    int
	rEOF    bool
	rerr    error
	unacked int64
	// recvWindow is what the peer may still send on the stream.
	recvWindow int64
	sentEnd    bool
	closed     bool
	// sink is the app socket Splice writes received bytes to (sink.go);
	// set once, under rmu.
	sink *appSink
}

// StatusError is a CONNECT answered with a status other than 200.
type StatusError struct{ Code int }

func (e *StatusError) Error() string { return "hbone: CONNECT answered " + strconv.Itoa(e.Code) }

// ID is the HTTP/2 stream ID.
func (s *Stream) ID() uint32 { return s.id }

// ResponseHeader is the server's response headers (client side).
func (s *Stream) ResponseHeader() map[string]string { return s.respHeader }

// delivery is what became of received bytes.
type delivery int

const (
	delivered delivery = iota
	discarded          // the stream is closed: the bytes go nowhere
	overrun            // past the stream's window: the peer broke flow control
)

// deliver queues received bytes (read loop only), or writes them
// through to the stream's sink; the caller returns the connection window
// of bytes not delivered, and of those written through (wrote), for
// which it also sends the stream WINDOW_UPDATE inc when not zero.
func (s *Stream) deliver(data []byte, end bool) (d delivery, wrote int, inc uint32) {
	s.rmu.Lock()
	if s.closed {
		s.rmu.Unlock()
		return discarded, 0, 0
	}
	s.recvWindow -= int64(len(data))
	// maxChunks is unreachable within the window (every chunk but the
	// first and last is full, and a frame takes at most one new chunk);
	// a bound all the same.
	if s.recvWindow < 0 || len(s.rq) >= maxChunks {
		s.rmu.Unlock()
		return overrun, 0, 0
	}
	wrote, inc = s.writeThroughLocked(data)
	data = data[wrote:]
	// Small frames fill the tail chunk's spare room before a new chunk is
	// taken, so what the stream holds follows the bytes it was sent, not
	// the number of frames that carried them.
	if n := len(s.rq); n > 0 && len(data) > 0 {
		m := s.rq[n-1].fill(data)
		s.rlen += m
		data = data[m:]
	}
	for len(data) > 0 {
		ch := newChunk(len(data))
		n := ch.fill(data)
		if s.rq == nil {
			s.rq = s.rq0[:0]
		}
		s.rq = append(s.rq, ch)
		s.rlen += n
		data = data[n:]
	}
	if end {
		s.rEOF = true
	}
	s.rcond.Broadcast()
	start := s.kickSinkLocked()
	done := s.rEOF && s.sentEnd
	s.rmu.Unlock()
	if start {
		go s.drainSink()
	}
	if done {
		s.c.removeStream(s.id, nil)
	}
	return delivered, wrote, inc
}

func (s *Stream) abort(err error) {
	s.rmu.Lock()
	if s.rerr == nil {
		s.rerr = err
	}
	s.rcond.Broadcast()
	start := s.kickSinkLocked()
	s.rmu.Unlock()
	if start {
		go s.drainSink()
	}
	s.c.mu.Lock()
	if s.werr == nil {
		s.werr = err
	}
	s.c.cond.Broadcast()
	s.c.mu.Unlock()
	s.answered(0, nil)
}

// answered records the CONNECT's response once (status 0: none came);
// it reports whether this was the first.
func (s *Stream) answered(status int, header map[string]string) bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.gotResp {
		return false
	}
	s.gotResp = true
	s.status, s.respHeader = status, header
	close(s.response)
	return true
}

// Read implements io.Reader.
func (s *Stream) Read(p []byte) (int, error) {
	s.rmu.Lock()
	for s.rlen == 0 && !s.rEOF && s.rerr == nil && !s.rdl.expired {
		s.rcond.Wait()
	}
	if s.rdl.expired {
		s.rmu.Unlock()
		return 0, &timeoutError{op: "read", stream: s.id}
	}
	if s.rlen == 0 {
		err := s.rerr
		if err == nil {
			err = io.EOF
		}
		s.rmu.Unlock()
		return 0, err
	}
	n := 0
	for n < len(p) && len(s.rq) > 0 {
		ch := s.rq[0]
		m := copy(p[n:], ch.b[ch.off:])
		n += m
		ch.off += m
		if ch.off == len(ch.b) {
			ch.release()
			s.rq[0] = nil
			s.rq = s.rq[1:]
		}
	}
	s.rlen -= n
	if len(s.rq) == 0 {
		s.rq = nil
	}
	s.rmu.Unlock()
	s.credit(int64(n))
	return n, nil
}

// popLocked takes the first queued chunk; callers hold rmu and have
// checked that one is queued. An emptied queue is nil, so that the next
// delivery starts again in rq0.
func (s *Stream) popLocked() *chunk {
	ch := s.rq[0]
	s.rq[0] = nil
	s.rq = s.rq[1:]
	if len(s.rq) == 0 {
		s.rq = nil
	}
	s.rlen -= len(ch.b) - ch.off
	return ch
}

// WriteTo implements io.WriterTo: received chunks go to w as they are,
// without an intermediate buffer, so an idle stream holds no memory.
func (s *Stream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		s.rmu.Lock()
		for s.rlen == 0 && !s.rEOF && s.rerr == nil && !s.rdl.expired {
			s.rcond.Wait()
		}
		if s.rdl.expired {
			s.rmu.Unlock()
			return total, &timeoutError{op: "read", stream: s.id}
		}
		if s.rlen == 0 {
			err := s.rerr
			s.rmu.Unlock()
			return total, err // nil at EOF
		}
		ch := s.popLocked()
		data := ch.b[ch.off:]
		s.rmu.Unlock()
		n, err := w.Write(data)
		total += int64(n)
		ch.release()
		s.credit(int64(len(data)))
		if err != nil {
			return total, err
		}
	}
}

// credit returns consumed bytes to the peer's windows, in batches.
func (s *Stream) credit(n int64) {
	s.rmu.Lock()
	inc := s.creditLocked(n)
	s.rmu.Unlock()
	if inc > 0 {
		_ = s.c.writeFrames(func() error { return s.c.fr.WriteWindowUpdate(s.id, uint32(inc)) })
	}
	s.c.consumed(n)
}

// creditLocked counts n consumed bytes and returns the stream
// WINDOW_UPDATE increment now due, if any; callers hold rmu.
func (s *Stream) creditLocked(n int64) int64 {
	s.unacked += n
	if s.unacked < StreamWindow/4 || s.rEOF {
		return 0
	}
	inc := s.unacked
	s.unacked = 0
	s.recvWindow += inc
	return inc
}

// Write implements io.Writer, honouring the peer's windows.
func (s *Stream) Write(p []byte) (int, error) {
	written := 0
	c := s.c
	for len(p) > 0 {
		c.mu.Lock()
		for (s.sendWindow <= 0 || c.sendWindow <= 0) && s.werr == nil && c.err == nil && !s.wdl.expired {
			c.cond.Wait()
		}
		if err := firstErr(s.werr, c.err); err != nil {
			c.mu.Unlock()
			return written, err
		}
		if s.wdl.expired {
			c.mu.Unlock()
			return written, &timeoutError{op: "write", stream: s.id}
		}
		n := int64(len(p))
		n = min(n, int64(c.peerMaxFrame), s.sendWindow, c.sendWindow)
		s.sendWindow -= n
		c.sendWindow -= n
		c.mu.Unlock()
		chunk := p[:n]
		if err := c.writeFrames(func() error { return c.fr.WriteData(s.id, false, chunk) }); err != nil {
			return written, err
		}
		written += int(n)
		p = p[n:]
	}
	return written, nil
}

// ReadFrom implements io.ReaderFrom. An idle connection holds a small
// buffer; a read that fills it borrows a large pooled one for as long as
// data keeps coming, so bulk transfers go out in large frames.
func (s *Stream) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	small := make([]byte, 4<<10)
	var large *[]byte
	defer func() {
		if large != nil {
			readBuffers.Put(large)
		}
	}()
	for {
		buf := small
		if large != nil {
			buf = *large
		}
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		switch {
		case n == len(buf) && large == nil:
			large = readBuffers.Get().(*[]byte)
		case n < len(buf)/2 && large != nil:
			readBuffers.Put(large)
			large = nil
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// CloseWrite ends our direction (END_STREAM); the peer reads EOF.
func (s *Stream) CloseWrite() error {
	s.rmu.Lock()
	if s.sentEnd || s.closed {
		s.rmu.Unlock()
		return nil
	}
	s.sentEnd = true
	done := s.rEOF
	s.rmu.Unlock()
	err := s.c.writeFrames(func() error { return s.c.fr.WriteData(s.id, true, nil) })
	if done {
		s.c.removeStream(s.id, nil)
	}
	return err
}

// Close ends the stream; one not finished both ways is reset.
func (s *Stream) Close() error {
	s.rmu.Lock()
	if s.closed {
		s.rmu.Unlock()
		return nil
	}
	s.closed = true
	finished := s.sentEnd && s.rEOF
	pending := int64(s.rlen)
	for _, ch := range s.rq {
		ch.release()
	}
	s.rq, s.rlen = nil, 0
	s.rdl.stop()
	s.rmu.Unlock()
	s.c.mu.Lock()
	s.wdl.stop()
	s.c.mu.Unlock()
	if pending > 0 {
		s.c.consumed(pending)
	}
	var err error
	if !finished {
		err = s.c.writeFrames(func() error { return s.c.fr.WriteRSTStream(s.id, http2.ErrCodeCancel) })
	}
	s.c.removeStream(s.id, nil)
	s.abort(ErrConnClosed)
	return err
}

// Respond answers a CONNECT (server side): 200 opens the tunnel, any
// other status ends the stream.
func (s *Stream) Respond(code int, header map[string]string) error {
	fields := [][2]string{{":status", strconv.Itoa(code)}}
	for k, v := range header {
		fields = append(fields, [2]string{k, v})
	}
	end := code != 200
	if err := s.c.writeHeaders(s.id, fields, end); err != nil {
		return err
	}
	if end {
		s.rmu.Lock()
		s.sentEnd = true
		s.rmu.Unlock()
		s.c.removeStream(s.id, nil)
	}
	return nil
}

func (s *Stream) onResponse(f *headerBlock) {
	s.answered(statusOf(f)) // later HEADERS are trailers
	if f.endStream {
		_, _, _ = s.deliver(nil, true)
	}
}

// awaitResponse waits for the CONNECT's answer (client side).
func (s *Stream) awaitResponse(ctx context.Context) error {
	select {
	case <-s.response:
	case <-ctx.Done():
		s.Close()
		return fmt.Errorf("hbone: no answer to CONNECT: %w", ctx.Err())
	}
	s.rmu.Lock()
	rerr, status := s.rerr, s.status
	s.rmu.Unlock()
	if status == 0 {
		if rerr == nil {
			rerr = ErrConnClosed
		}
		return fmt.Errorf("hbone: CONNECT: %w", rerr)
	}
	if status != 200 {
		s.Close()
		return &StatusError{Code: status}
	}
	return nil
}
