package hbone

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// HTTP/2 settings (wire contract §5.3).
const (
	StreamWindow  = 4 << 20
	ConnWindow    = 16 << 20
	MaxFrame      = 1 << 20
	MaxHeaderList = 16 << 10
	// MaxStreams is the default of Limits.MaxStreams.
	MaxStreams = 1000
	// defaultWindow is HTTP/2's initial window before SETTINGS.
	defaultWindow = 65535
)

// conn is one HTTP/2 connection, either side.
type conn struct {
	nc       net.Conn
	fr       *http2.Framer
	bw       *bufio.Writer
	isClient bool
	lim      Limits

	// wmu serializes frame writes; writers counts those waiting, so the
	// last one flushes.
	wmu     sync.Mutex
	writers atomic.Int32
	henc    *hpack.Encoder
	hbuf    bytes.Buffer
	// ctrlSpare is the control queue's other buffer (control.go).
	ctrlSpare []ctrlFrame
	// writeDeadline is the socket's write deadline (extendWriteDeadline);
	// closing stops its updates while the last GOAWAY is written.
	writeDeadline time.Time
	closing       atomic.Bool

	// The control queue (control.go). ctrlPending is set while ctrl is
	// not empty, for writers to check without the lock.
	cmu            sync.Mutex
	ctrl           []ctrlFrame
	ctrlConnUpdate int // index of the queued connection WINDOW_UPDATE, or -1
	ctrlFlushing   bool
	ctrlPending    atomic.Bool

	mu      sync.Mutex
	cond    *sync.Cond // send windows opened, streams changed, closed
	streams map[uint32]*Stream
	nextID  uint32
	// peer settings
	peerMaxFrame      uint32
	peerInitialWindow int32
	sendWindow        int64 // connection-level
	recvUnacked       int64 // connection bytes consumed, not yet updated
	// recvWindow is what the peer may still send on the connection; a
	// peer that ignores it is cut off rather than buffered without bound.
	recvWindow int64
	err        error // set once closed
	goAway     bool  // received or sent GOAWAY: no new streams
	draining   bool  // GoAway (server) or CloseWhenIdle (client) was called
	// goAwaySeen: the peer answered the PING after our GOAWAY, or is no
	// longer waited for (goAwayGracefully).
	goAwaySeen     bool
	lastPeerStream uint32
	idleSince      time.Time
	onStream       func(*Stream) // server: a new CONNECT
	done           chan struct{}
	closeOnce      sync.Once

	// handlers is the number of handlers running (server); with the
	// streams, it counts against Limits.MaxStreams.
	handlers int

	hr *headerReader // owned by the read loop
	// started is set by the peer's first SETTINGS frame (read loop).
	started bool
	// idleTimer runs checkIdle (idle.go); guarded by mu.
	idleTimer *time.Timer
	// idleChecks counts the idle timer's runs (tests).
	idleChecks atomic.Int32

	// Owned by the read loop: what the peer has spent of its Limits.
	pings, settings, resets bucket
	emptyFrames             int // frames without payload in a row
}

func newConn(nc net.Conn, isClient bool, lim Limits) *conn {
	c := &conn{
		nc: nc, isClient: isClient, lim: lim.withDefaults(), bw: bufio.NewWriterSize(nc, 64<<10),
		streams: map[uint32]*Stream{}, peerMaxFrame: 16384, peerInitialWindow: defaultWindow,
		sendWindow: defaultWindow, recvWindow: ConnWindow, idleSince: time.Now(), done: make(chan struct{}),
		ctrlConnUpdate: -1,
	}
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 64<<10))
	c.fr.SetMaxReadFrameSize(MaxFrame)
	// One DATA frame value for all: onData is done with a frame before
	// the next is read (its bytes are copied or written through).
	c.fr.SetReuseFrames()
	c.hr = newHeaderReader()
	c.henc = hpack.NewEncoder(&c.hbuf)
	if isClient {
		c.nextID = 1
	}
	return c
}

// refused is an error a writeFrames callback returns without writing:
// the connection is fine, the caller's request is not.
type refused struct{ error }

func (r refused) Unwrap() error { return r.error }

// writeFrames runs f under the write lock, after the queued control
// frames, and flushes when no other writer is waiting. A write error
// ends the connection.
func (c *conn) writeFrames(f func() error) error {
	c.writers.Add(1)
	c.wmu.Lock()
	c.extendWriteDeadline()
	err := c.writeControlLocked()
	if err == nil {
		err = f()
	}
	var r refused
	if err != nil {
		r = asRefused(err)
		if r.error != nil {
			err = nil
		}
	}
	if c.writers.Add(-1) == 0 && err == nil {
		err = c.flushLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("hbone write: %w", err))
	}
	if r.error != nil {
		// Why the caller was refused (the connection's error, say)
		// tells it more than a flush failing for the same reason.
		return r.error
	}
	return err
}

// asRefused is err's refused, if any; apart from writeFrames since
// errors.As's target escapes, an allocation per write otherwise (and
// not inlined there, for the same reason).
//
//go:noinline
func asRefused(err error) refused {
	var r refused
	errors.As(err, &r)
	return r
}

// flushLocked pushes buffered frames to the socket; callers hold wmu.
func (c *conn) flushLocked() error {
	if err := c.bw.Flush(); err != nil {
		return err
	}
	if f, ok := c.nc.(flusher); ok {
		return f.Flush()
	}
	return nil
}

// extendWriteDeadline keeps the socket's write deadline at least half of
// WriteTimeout ahead of a write starting, so that a write making no
// progress for WriteTimeout fails (and ends the connection). It moves
// the deadline only once half of it has passed, not on every write.
// Callers hold wmu.
func (c *conn) extendWriteDeadline() {
	if c.lim.WriteTimeout < 0 || c.closing.Load() {
		return
	}
	now := time.Now()
	if c.writeDeadline.Sub(now) > c.lim.WriteTimeout/2 {
		return
	}
	c.writeDeadline = now.Add(c.lim.WriteTimeout)
	_ = c.nc.SetWriteDeadline(c.writeDeadline)
}

// handshake sends our preface (client) and settings, and the extra
// connection window.
func (c *conn) handshake() error {
	return c.writeFrames(func() error {
		if c.isClient {
			if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
				return err
			}
		}
		settings := []http2.Setting{
			{ID: http2.SettingInitialWindowSize, Val: StreamWindow},
			{ID: http2.SettingMaxFrameSize, Val: MaxFrame},
			{ID: http2.SettingMaxConcurrentStreams, Val: uint32(c.lim.MaxStreams)},
			{ID: http2.SettingMaxHeaderListSize, Val: MaxHeaderList},
		}
		if c.isClient {
			settings = append(settings, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
		}
		if err := c.fr.WriteSettings(settings...); err != nil {
			return err
		}
		return c.fr.WriteWindowUpdate(0, ConnWindow-defaultWindow)
	})
}

// fail closes the connection and every stream with err.
func (c *conn) fail(err error) {
	if c.setErr(err) {
		c.closeConn()
	}
}

// setErr records why the connection ends and fails its streams; it
// reports whether err is the first such error.
func (c *conn) setErr(err error) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.err = err
	streams := c.streams
	c.streams = map[uint32]*Stream{}
	c.cond.Broadcast()
	c.mu.Unlock()
	for _, s := range streams {
		s.abort(err)
	}
	return true
}

// closeConn closes the socket, once.
func (c *conn) closeConn() {
	c.closeOnce.Do(func() {
		c.nc.Close()
		c.stopIdle()
		close(c.done)
	})
}

// goAwayTimeout bounds the write of a closing GOAWAY: a peer that does
// not read is not told why.
const goAwayTimeout = time.Second

// closeWith ends the connection for err after telling the peer why
// (GOAWAY with goAwayCode(err)).
func (c *conn) closeWith(err error) {
	c.closeGoAway(err, c.lastPeer())
}

// closeGoAway is closeWith with the last stream the GOAWAY reports as
// processed.
func (c *conn) closeGoAway(err error, last uint32) {
	if !c.setErr(err) {
		return
	}
	c.dropControl()
	c.closing.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(goAwayTimeout))
	_ = c.writeGoAway(last, goAwayCode(err), []byte(err.Error()))
	c.closeConn()
}

// writeGoAway writes a GOAWAY and flushes it now, not when a writer
// waiting behind it is done: the socket may close next.
func (c *conn) writeGoAway(last uint32, code http2.ErrCode, debug []byte) error {
	return c.writeFrames(func() error {
		if err := c.fr.WriteGoAway(last, code, debug); err != nil {
			return err
		}
		return c.flushLocked()
	})
}

// readLoop reads frames until the connection ends. It never writes to
// the socket (control.go).
func (c *conn) readLoop() {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			var ce http2.ConnectionError
			switch {
			case errors.As(err, &se):
				err = c.resetStream(se.StreamID, se.Code)
			case errors.As(err, &ce):
				err = fmt.Errorf("%w: %w", ErrProtocol, err)
			case errors.Is(err, io.EOF):
				c.fail(ErrConnClosed)
				return
			case !c.started && isTimeout(err):
				c.fail(fmt.Errorf("%w: %w", ErrHandshakeTimeout, err))
				return
			default:
				c.fail(fmt.Errorf("hbone read: %w", err))
				return
			}
		} else {
			err = c.handle(f)
		}
		if err != nil {
			c.closeWith(err)
			return
		}
	}
}

// start checks the peer's first frame, which must be SETTINGS (RFC 9113
// §3.4), and ends the handshake.
func (c *conn) start(f http2.Frame) error {
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		return fmt.Errorf("%w: first frame %v, want SETTINGS", ErrProtocol, f.Header().Type)
	}
	c.started = true
	_ = c.nc.SetReadDeadline(time.Time{})
	c.startIdle()
	return nil
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (c *conn) lastPeer() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastPeerStream
}

func (c *conn) handle(f http2.Frame) error {
	if !c.started {
		if err := c.start(f); err != nil {
			return err
		}
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if !c.settings.take(c.lim.Settings, time.Now()) {
			return fmt.Errorf("%w: SETTINGS faster than %v", ErrFlood, c.lim.Settings)
		}
		if err := c.applySettings(f); err != nil {
			return err
		}
		return c.queueControl(ctrlFrame{kind: ctrlSettingsAck})
	case *http2.PingFrame:
		if f.IsAck() {
			if f.Data == goAwayPing {
				c.peerSawGoAway()
			}
			return nil
		}
		if !c.pings.take(c.lim.Pings, time.Now()) {
			return fmt.Errorf("%w: PING faster than %v", ErrFlood, c.lim.Pings)
		}
		return c.queueControl(ctrlFrame{kind: ctrlPingAck, ping: f.Data})
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.HeadersFrame:
		if err := c.countEmpty(len(f.HeaderBlockFragment()) == 0 && !f.StreamEnded()); err != nil {
			return err
		}
		b, err := c.hr.headers(f)
		if b == nil || err != nil {
			return err
		}
		return c.onHeaders(b)
	case *http2.ContinuationFrame:
		if err := c.countEmpty(len(f.HeaderBlockFragment()) == 0); err != nil {
			return err
		}
		b, err := c.hr.continuation(f)
		if b == nil || err != nil {
			return err
		}
		return c.onHeaders(b)
	case *http2.RSTStreamFrame:
		if c.idleStream(f.StreamID) {
			return fmt.Errorf("%w: RST_STREAM for stream %d, never opened", ErrProtocol, f.StreamID)
		}
		if err := c.countReset(); err != nil {
			return err
		}
		c.removeStream(f.StreamID, ErrReset)
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.goAway = true
		var gone []*Stream
		for id, s := range c.streams {
			if c.isClient && id > f.LastStreamID {
				gone = append(gone, s)
				delete(c.streams, id)
			}
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		for _, s := range gone {
			s.abort(ErrGoAway)
		}
	case *http2.PushPromiseFrame:
		return fmt.Errorf("%w: PUSH_PROMISE received; push is disabled", ErrProtocol)
	}
	return nil
}

// maxWindow is the largest flow-control window (RFC 9113 §6.9.1).
const maxWindow = 1<<31 - 1

// maxSettingsPerFrame bounds the parameters of one SETTINGS frame; HTTP/2
// defines seven, so more is an attack: each could touch every stream.
const maxSettingsPerFrame = 100

func (c *conn) applySettings(f *http2.SettingsFrame) error {
	if n := f.NumSettings(); n > maxSettingsPerFrame {
		return fmt.Errorf("%w: SETTINGS with %d parameters, more than %d", ErrProtocol, n, maxSettingsPerFrame)
	}
	// A repeated parameter takes its last value (RFC 9113 §6.5.3): apply
	// each once.
	var maxFrame, window uint32
	var setMaxFrame, setWindow bool
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		switch s.ID {
		case http2.SettingMaxFrameSize:
			maxFrame, setMaxFrame = s.Val, true
		case http2.SettingInitialWindowSize:
			window, setWindow = s.Val, true
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if setMaxFrame {
		c.peerMaxFrame = maxFrame
	}
	if setWindow {
		delta := int64(window) - int64(c.peerInitialWindow)
		c.peerInitialWindow = int32(window)
		for id, st := range c.streams {
			if st.sendWindow+delta > maxWindow {
				return fmt.Errorf("%w: SETTINGS_INITIAL_WINDOW_SIZE takes stream %d past %d", errFlowControl, id, maxWindow)
			}
			st.sendWindow += delta
		}
		c.cond.Broadcast()
	}
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	over := false
	c.mu.Lock()
	if f.StreamID == 0 {
		if over = c.sendWindow+inc > maxWindow; !over {
			c.sendWindow += inc
		}
	} else if s := c.streams[f.StreamID]; s != nil {
		if over = s.sendWindow+inc > maxWindow; !over {
			s.sendWindow += inc
		}
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	switch {
	case over && f.StreamID == 0:
		return fmt.Errorf("%w: WINDOW_UPDATE takes the connection past %d", errFlowControl, maxWindow)
	case over:
		return c.resetStream(f.StreamID, http2.ErrCodeFlowControl) // a stream error (RFC 9113 §6.9.1)
	}
	return nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	if err := c.countEmpty(len(f.Data()) == 0 && !f.StreamEnded()); err != nil {
		return err
	}
	n := int64(f.Length)
	c.mu.Lock()
	s := c.streams[f.StreamID]
	c.recvWindow -= n
	over := c.recvWindow < 0
	c.mu.Unlock()
	if over {
		return fmt.Errorf("%w: the connection's", errFlowControl)
	}
	if s == nil {
		// A stream we reset or finished: its bytes still count against the
		// connection window.
		return c.discard(n)
	}
	if pad := n - int64(len(f.Data())); pad > 0 {
		if err := c.discard(pad); err != nil {
			return err
		}
	}
	d, wrote, inc := s.deliver(f.Data(), f.StreamEnded())
	if inc > 0 {
		if err := c.queueControl(ctrlFrame{kind: ctrlWindowUpdate, stream: f.StreamID, val: inc}); err != nil {
			return err
		}
	}
	if wrote > 0 {
		if err := c.discard(int64(wrote)); err != nil {
			return err
		}
	}
	switch d {
	case discarded:
		return c.discard(int64(len(f.Data())))
	case overrun:
		// The peer ignored the stream's window.
		if err := c.discard(int64(len(f.Data()))); err != nil {
			return err
		}
		return c.resetStream(f.StreamID, http2.ErrCodeFlowControl)
	}
	return nil
}

// countEmpty counts a frame that may carry payload (DATA, HEADERS,
// CONTINUATION) toward Limits.MaxEmptyFrames: empty ones in a row are a
// flood, one with payload starts the count again. Padding is not
// payload: a peer could pad empty frames for free (the connection
// window returns padding at once).
func (c *conn) countEmpty(empty bool) error {
	if !empty {
		c.emptyFrames = 0
		return nil
	}
	c.emptyFrames++
	if c.emptyFrames > c.lim.MaxEmptyFrames {
		return fmt.Errorf("%w: %d frames without payload in a row", ErrFlood, c.emptyFrames)
	}
	return nil
}

// creditConn returns n consumed bytes to the connection window and the
// WINDOW_UPDATE increment now due, if any: updates go in batches.
func (c *conn) creditConn(n int64) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recvUnacked += n
	if c.recvUnacked < ConnWindow/4 {
		return 0
	}
	inc := c.recvUnacked
	c.recvUnacked = 0
	c.recvWindow += inc
	return uint32(inc)
}

// consumed returns n connection-window bytes to the peer; stream users
// call it and write the update themselves.
func (c *conn) consumed(n int64) {
	if inc := c.creditConn(n); inc > 0 {
		_ = c.writeFrames(func() error { return c.fr.WriteWindowUpdate(0, inc) })
	}
}

// discard is consumed for the read loop: the update is queued.
func (c *conn) discard(n int64) error {
	if inc := c.creditConn(n); inc > 0 {
		return c.queueControl(ctrlFrame{kind: ctrlWindowUpdate, val: inc})
	}
	return nil
}

func (c *conn) onHeaders(f *headerBlock) error {
	if c.isClient {
		c.mu.Lock()
		s := c.streams[f.stream]
		c.mu.Unlock()
		switch {
		case s == nil:
		case f.malformed != nil:
			return c.resetStream(f.stream, http2.ErrCodeProtocol)
		default:
			s.onResponse(f)
		}
		return nil
	}
	if f.stream%2 == 0 || f.stream <= c.lastPeer() {
		return fmt.Errorf("%w: bad client stream id %d", ErrProtocol, f.stream)
	}
	c.mu.Lock()
	c.lastPeerStream = f.stream
	// A stream's slot frees when its handler returns, not when the peer
	// resets it: otherwise each HEADERS + RST_STREAM pair would start a
	// handler (the rapid reset attack). A peer at the limit may then be
	// refused a stream it counts as free; REFUSED_STREAM is safe to
	// retry.
	full := len(c.streams) >= c.lim.MaxStreams || c.handlers >= c.lim.MaxStreams
	refused := c.goAway
	c.mu.Unlock()
	switch {
	case f.malformed != nil:
		return c.resetStream(f.stream, http2.ErrCodeProtocol)
	case full || refused:
		return c.resetStream(f.stream, http2.ErrCodeRefusedStream)
	}
	req, err := parseRequest(f)
	if err != nil {
		// Answered here, the stream never opens: its DATA, if any, is
		// discarded as a finished stream's, and NO_ERROR asks the peer
		// to stop sending (RFC 9113 §8.1). It counts as a reset.
		if err := c.countReset(); err != nil {
			return err
		}
		if err := c.queueControl(ctrlFrame{kind: ctrlStatus, stream: f.stream, val: 400}); err != nil || f.endStream {
			return err
		}
		return c.queueControl(ctrlFrame{kind: ctrlReset, stream: f.stream, val: uint32(http2.ErrCodeNo)})
	}
	c.mu.Lock()
	s := c.newStreamLocked(f.stream)
	c.handlers++
	c.mu.Unlock()
	s.Request = req
	if f.endStream {
		_, _, _ = s.deliver(nil, true)
	}
	go c.runHandler(s)
	return nil
}

// runHandler runs the server's handler for s, counting it against
// Limits.MaxStreams until it returns.
func (c *conn) runHandler(s *Stream) {
	defer func() {
		c.mu.Lock()
		c.handlers--
		if c.handlers == 0 && len(c.streams) == 0 {
			c.idleSince = time.Now()
		}
		c.cond.Broadcast() // closeWhenIdle waits for the handlers too
		c.mu.Unlock()
	}()
	c.onStream(s)
}

// resetStream resets stream id for the peer's doing (a refusal, a
// broken window, a malformed frame), which counts against
// Limits.Resets as the peer's own resets do.
func (c *conn) resetStream(id uint32, code http2.ErrCode) error {
	if err := c.countReset(); err != nil {
		return err
	}
	c.removeStream(id, ErrReset)
	return c.queueControl(ctrlFrame{kind: ctrlReset, stream: id, val: uint32(code)})
}

// countReset spends one of Limits.Resets.
func (c *conn) countReset() error {
	if !c.resets.take(c.lim.Resets, time.Now()) {
		return fmt.Errorf("%w: more than %v", ErrTooManyResets, c.lim.Resets)
	}
	return nil
}

// idleStream reports whether stream id was never opened, by either side.
func (c *conn) idleStream(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClient {
		return id%2 == 0 || id >= c.nextID
	}
	return id%2 == 0 || id > c.lastPeerStream
}

// newStreamLocked registers a stream; callers hold mu.
func (c *conn) newStreamLocked(id uint32) *Stream {
	s := &Stream{c: c, id: id, response: make(chan struct{}), sendWindow: int64(c.peerInitialWindow), recvWindow: StreamWindow}
	s.rcond = sync.NewCond(&s.rmu)
	c.streams[id] = s
	return s
}

// removeStream forgets a stream, failing its pending I/O with err.
func (c *conn) removeStream(id uint32, err error) {
	c.mu.Lock()
	s := c.streams[id]
	delete(c.streams, id)
	if len(c.streams) == 0 && c.handlers == 0 {
		c.idleSince = time.Now()
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	if s != nil && err != nil {
		s.abort(err)
	}
}

// encodeHeaders HPACK-encodes fields; callers hold wmu.
func (c *conn) encodeHeaders(fields [][2]string) []byte {
	c.hbuf.Reset()
	for _, f := range fields {
		_ = c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return c.hbuf.Bytes()
}

// writeHeaders sends a HEADERS frame (CONTINUATION is not needed: our
// header blocks stay under the peer's frame size).
func (c *conn) writeHeaders(id uint32, fields [][2]string, end bool) error {
	return c.writeFrames(func() error {
		block := c.encodeHeaders(fields)
		if uint32(len(block)) > c.peerMaxFrameSize() {
			return fmt.Errorf("header block of %d bytes", len(block)) // HPACK state moved: fatal
		}
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: end})
	})
}

func (c *conn) peerMaxFrameSize() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peerMaxFrame
}

// Request is a CONNECT request's pseudo-headers and headers.
type Request struct {
	Authority string
	// Header holds the regular headers (lower-case names), e.g. baggage,
	// forwarded, traceparent.
	Header map[string]string
}

// parseRequest validates a CONNECT (wire contract §5.3): classic CONNECT, no
// :scheme or :path, an authority.
func parseRequest(f *headerBlock) (Request, error) {
	r := Request{Header: map[string]string{}}
	method := ""
	for _, hf := range f.fields {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":authority":
			r.Authority = hf.Value
		case ":scheme", ":path", ":protocol":
			return r, fmt.Errorf("%s in a CONNECT request", hf.Name)
		default:
			if !hf.IsPseudo() {
				r.Header[hf.Name] = hf.Value
			}
		}
	}
	if method != "CONNECT" {
		return r, fmt.Errorf("method %q, want CONNECT", method)
	}
	if r.Authority == "" {
		return r, errors.New("no :authority")
	}
	return r, nil
}

func statusOf(f *headerBlock) (int, map[string]string) {
	hdr := map[string]string{}
	code := 0
	for _, hf := range f.fields {
		if hf.Name == ":status" {
			code, _ = strconv.Atoi(hf.Value)
		} else if !hf.IsPseudo() {
			hdr[hf.Name] = hf.Value
		}
	}
	return code, hdr
}
