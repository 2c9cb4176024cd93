package hbone

// The tests here are attacks, written as the attacker would: a bare
// http2.Framer on one end of a pipe, the HBONE server (or client) on the
// other. They assert bounds (heap, goroutines, concurrent handlers) and
// the error the connection ends with, never how long something took.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
)

// seen is what the raw peer read: a copy, since a Framer's frames are
// only valid until its next read.
type seen struct {
	typ    http2.FrameType
	stream uint32
	ack    bool
	end    bool
	code   http2.ErrCode // RST_STREAM, GOAWAY
	status string        // HEADERS
	n      int           // DATA payload
}

// rawPeer is one end of an HBONE connection driven frame by frame.
type rawPeer struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder

	mu     sync.Mutex
	frames []seen
	ended  bool // the read side ended: the connection is closed
}

func newRawPeer(t *testing.T, nc net.Conn) *rawPeer {
	p := &rawPeer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.henc = hpack.NewEncoder(&p.hbuf)
	t.Cleanup(func() { nc.Close() })
	return p
}

// attackServer serves one connection over a pipe with handler and
// returns the attacker's end, its preface and SETTINGS sent, and the
// server's end-of-connection channel.
func attackServer(t *testing.T, handler func(*Stream)) (*rawPeer, <-chan error) {
	t.Helper()
	return attackServerWith(t, Limits{}, handler)
}

// attackServerWith is attackServer with limits.
func attackServerWith(t *testing.T, lim Limits, handler func(*Stream)) (*rawPeer, <-chan error) {
	t.Helper()
	p, _, done := attackServerConn(t, lim, handler)
	return p, done
}

// attackServerConn is attackServerWith that also returns the server's
// connection.
func attackServerConn(t *testing.T, lim Limits, handler func(*Stream)) (*rawPeer, *ServerConn, <-chan error) {
	t.Helper()
	a, b := net.Pipe()
	sc, done := ServeWith(b, lim, handler)
	p := newRawPeer(t, a)
	p.read()
	p.write([]byte(http2.ClientPreface))
	p.check(p.fr.WriteSettings())
	return p, sc, done
}

// read records every frame the peer receives, until the connection
// ends.
func (p *rawPeer) read() {
	go func() {
		for {
			f, err := p.fr.ReadFrame()
			if err != nil {
				p.mu.Lock()
				p.ended = true
				p.mu.Unlock()
				return
			}
			s := seen{typ: f.Header().Type, stream: f.Header().StreamID}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				s.ack = f.IsAck()
			case *http2.PingFrame:
				s.ack = f.IsAck()
			case *http2.RSTStreamFrame:
				s.code = f.ErrCode
			case *http2.GoAwayFrame:
				s.code = f.ErrCode
			case *http2.MetaHeadersFrame:
				s.status, s.end = f.PseudoValue("status"), f.StreamEnded()
			case *http2.DataFrame:
				s.n, s.end = len(f.Data()), f.StreamEnded()
			}
			p.mu.Lock()
			p.frames = append(p.frames, s)
			p.mu.Unlock()
		}
	}()
}

func (p *rawPeer) write(b []byte) {
	_, _ = p.nc.Write(b)
}

// check ignores write errors: the server closing mid-attack is a
// legitimate outcome that the assertions look at.
func (p *rawPeer) check(error) {}

// headers opens stream id with a CONNECT.
func (p *rawPeer) headers(id uint32) error {
	p.hbuf.Reset()
	_ = p.henc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	_ = p.henc.WriteField(hpack.HeaderField{Name: ":authority", Value: "10.0.0.1:80"})
	return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.hbuf.Bytes(), EndHeaders: true})
}

// respond answers stream id with status (a server).
func (p *rawPeer) respond(id uint32, status string) error {
	p.hbuf.Reset()
	_ = p.henc.WriteField(hpack.HeaderField{Name: ":status", Value: status})
	return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.hbuf.Bytes(), EndHeaders: true})
}

// count is how many received frames match f.
func (p *rawPeer) count(f func(seen) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.frames {
		if f(s) {
			n++
		}
	}
	return n
}

// waitFor waits until a received frame matches f and returns it.
func (p *rawPeer) waitFor(what string, f func(seen) bool) seen {
	p.t.Helper()
	var got seen
	eventually.True(p.t, what, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, s := range p.frames {
			if f(s) {
				got = s
				return true
			}
		}
		return false
	})
	return got
}

// sync sends a PING and waits for its ACK: the server has handled every
// frame sent before.
func (p *rawPeer) sync() {
	p.t.Helper()
	before := p.count(isPingAck)
	p.check(p.fr.WritePing(false, [8]byte{1}))
	eventually.True(p.t, "PING answered", func() bool { return p.count(isPingAck) > before })
}

func isPingAck(s seen) bool { return s.typ == http2.FramePing && s.ack }

// heapInUse is the live heap after the garbage collector has run twice
// (the second run empties the sync.Pools' victim caches).
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// block is a handler that answers 200 and then holds its stream, never
// reading, until the test ends.
func block(t *testing.T) func(*Stream) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(s *Stream) {
		_ = s.Respond(200, nil)
		<-release
	}
}

// drain is a handler that answers 200 and reads its stream until it
// ends.
func drain(s *Stream) {
	_ = s.Respond(200, nil)
	_, _ = io.Copy(io.Discard, s)
}

// TestTinyDataFramesHoldWhatTheyCarry: DATA frames on a stream nobody
// reads cost the server about the bytes they carry, not a buffer each.
func TestTinyDataFramesHoldWhatTheyCarry(t *testing.T) {
	for _, tt := range []struct {
		name   string
		frames int
		size   int
	}{
		{"1-byte frames", 20000, 1},
		{"frames just over a small buffer", 100, 16<<10 + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := attackServer(t, block(t))
			p.check(p.headers(1))
			p.waitFor("CONNECT answered", func(s seen) bool { return s.typ == http2.FrameHeaders })
			before := heapInUse()
			payload := make([]byte, tt.size)
			for range tt.frames {
				p.check(p.fr.WriteData(1, false, payload))
			}
			p.sync()
			grew := int64(heapInUse()) - int64(before)
			sent := int64(tt.frames * tt.size)
			if limit := 2*sent + 1<<20; grew > limit {
				t.Errorf("%d bytes in %d DATA frames grew the heap by %d bytes, want at most %d", sent, tt.frames, grew, limit)
			}
		})
	}
}

// readHandshake reads the server's SETTINGS and connection
// WINDOW_UPDATE, synchronously: for attackers that then never read.
func (p *rawPeer) readHandshake() {
	p.t.Helper()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			p.t.Fatalf("read the server's handshake: %v", err)
		}
		if f.Header().Type == http2.FrameWindowUpdate {
			return
		}
	}
}

// ended waits for the connection's error.
func ended(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(eventually.DefaultTimeout):
		t.Fatal("the connection did not end")
		return nil
	}
}

// TestControlFramesForAPeerThatDoesNotRead: PINGs from a peer that never
// reads queue at most MaxControlQueue answers, then the connection ends
// with ENHANCE_YOUR_CALM; the read loop never blocks on the peer.
func TestControlFramesForAPeerThatDoesNotRead(t *testing.T) {
	base := runtime.NumGoroutine()
	a, b := net.Pipe()
	// PINGs at any rate: the queue is what must stop them.
	_, done := ServeWith(b, Limits{MaxControlQueue: 100, Pings: Rate{Burst: 1 << 30, PerSecond: 1 << 30}}, drain)
	p := newRawPeer(t, a)
	p.write([]byte(http2.ClientPreface))
	p.readHandshake()
	go func() {
		_ = p.fr.WriteSettings()
		for range 1_000_000 {
			if p.fr.WritePing(false, [8]byte{}) != nil {
				return
			}
		}
	}()
	if err := ended(t, done); !errors.Is(err, ErrEnhanceYourCalm) {
		t.Errorf("connection ended with %v, want ErrEnhanceYourCalm", err)
	}
	a.Close()
	settle(t, base)
}

// TestFloodsAreCut: control frames past their Limits end the connection
// with GOAWAY ENHANCE_YOUR_CALM (ErrFlood).
func TestFloodsAreCut(t *testing.T) {
	for _, tt := range []struct {
		name   string
		attack func(p *rawPeer) error
	}{
		{"PING", func(p *rawPeer) error {
			for range 10000 {
				if err := p.fr.WritePing(false, [8]byte{}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"SETTINGS", func(p *rawPeer) error {
			for range 10000 {
				if err := p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"empty DATA", func(p *rawPeer) error {
			if err := p.headers(1); err != nil {
				return err
			}
			for range 10000 {
				if err := p.fr.WriteData(1, false, nil); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			// A queue long enough for the whole attack: the rate is
			// what must stop it.
			p, done := attackServerWith(t, Limits{MaxControlQueue: 1 << 20}, drain)
			go func() { _ = tt.attack(p) }()
			if err := ended(t, done); !errors.Is(err, ErrFlood) {
				t.Errorf("connection ended with %v, want ErrFlood", err)
			}
			p.waitFor("GOAWAY ENHANCE_YOUR_CALM", func(s seen) bool {
				return s.typ == http2.FrameGoAway && s.code == http2.ErrCodeEnhanceYourCalm
			})
			p.nc.Close()
			settle(t, base)
		})
	}
}

// running is the number of handlers running.
func (sc *ServerConn) running() int {
	sc.c.mu.Lock()
	defer sc.c.mu.Unlock()
	return sc.c.handlers
}

// settle waits until the goroutines started since base have ended.
func settle(t *testing.T, base int) {
	t.Helper()
	eventually.True(t, "goroutines back to their number before the test", func() bool { return runtime.NumGoroutine() <= base })
}

// TestRapidReset: HEADERS each followed by RST_STREAM (CVE-2023-44487)
// never run more handlers at once than MaxStreams, and the connection
// ends with GOAWAY ENHANCE_YOUR_CALM (ErrTooManyResets).
func TestRapidReset(t *testing.T) {
	base := runtime.NumGoroutine()
	var running, most atomic.Int64
	release := make(chan struct{})
	handler := func(*Stream) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		running.Add(-1)
	}
	p, done := attackServer(t, handler)
	attacked := make(chan struct{})
	go func() {
		defer close(attacked)
		for id := uint32(1); id < 10000; id += 2 {
			if p.headers(id) != nil || p.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				return
			}
		}
	}()
	select {
	case <-attacked:
	case <-time.After(eventually.DefaultTimeout):
		t.Fatal("the attack did not end")
	}
	t.Logf("%d handlers at most ran at once", most.Load())
	if n := most.Load(); n > MaxStreams {
		t.Errorf("%d handlers ran at once, want at most MaxStreams (%d)", n, MaxStreams)
	}
	if err := ended(t, done); !errors.Is(err, ErrTooManyResets) {
		t.Errorf("connection ended with %v, want ErrTooManyResets", err)
	}
	p.waitFor("GOAWAY ENHANCE_YOUR_CALM", func(s seen) bool {
		return s.typ == http2.FrameGoAway && s.code == http2.ErrCodeEnhanceYourCalm
	})
	close(release)
	p.nc.Close()
	settle(t, base)
}

// TestStreamsPastMaxStreamsAreRefused: the stream after MaxStreams is
// refused (REFUSED_STREAM, safe to retry) and the connection serves new
// streams once one has ended.
func TestStreamsPastMaxStreamsAreRefused(t *testing.T) {
	const max = 10
	p, sc, _ := attackServerConn(t, Limits{MaxStreams: max}, func(s *Stream) {
		_ = s.Respond(200, nil)
		_, _ = io.Copy(io.Discard, s)
		_ = s.CloseWrite()
	})
	answered := func(id uint32) func(seen) bool {
		return func(s seen) bool {
			return s.stream == id && (s.typ == http2.FrameHeaders || s.typ == http2.FrameRSTStream)
		}
	}
	for i := range uint32(max) {
		p.check(p.headers(2*i + 1))
		if got := p.waitFor("CONNECT answered", answered(2*i+1)); got.status != "200" {
			t.Fatalf("stream %d of %d answered %+v, want 200", i+1, max, got)
		}
	}
	p.check(p.headers(2*max + 1))
	if got := p.waitFor("stream past MaxStreams answered", answered(2*max+1)); got.typ != http2.FrameRSTStream || got.code != http2.ErrCodeRefusedStream {
		t.Errorf("stream past MaxStreams answered %+v, want RST_STREAM REFUSED_STREAM", got)
	}
	// The first stream ends both ways; its handler returns.
	p.check(p.fr.WriteData(1, true, nil))
	p.waitFor("first stream ended", func(s seen) bool { return s.stream == 1 && s.end })
	eventually.True(t, "first handler returned", func() bool { return sc.running() < max })
	p.check(p.headers(2*max + 3))
	if got := p.waitFor("stream after one ended answered", answered(2*max+3)); got.status != "200" {
		t.Errorf("stream after one ended answered %+v, want 200", got)
	}
}

// TestBrokenSettingsAndWindowsEndTheConnection: frames that break
// SETTINGS or window rules end the connection with a GOAWAY that says
// which rule.
func TestBrokenSettingsAndWindowsEndTheConnection(t *testing.T) {
	many := func(n int) []http2.Setting {
		s := make([]http2.Setting, n)
		for i := range s {
			s[i] = http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(i)}
		}
		return s
	}
	for _, tt := range []struct {
		name   string
		attack func(p *rawPeer) error
		code   http2.ErrCode
	}{
		{"101 settings in one frame", func(p *rawPeer) error {
			return p.fr.WriteSettings(many(101)...)
		}, http2.ErrCodeProtocol},
		{"connection window past 2^31-1", func(p *rawPeer) error {
			_ = p.fr.WriteWindowUpdate(0, 1<<31-1)
			return p.fr.WriteWindowUpdate(0, 1<<31-1)
		}, http2.ErrCodeFlowControl},
		{"stream window past 2^31-1 by SETTINGS", func(p *rawPeer) error {
			_ = p.headers(1)
			_ = p.fr.WriteWindowUpdate(1, 1<<31-1-defaultWindow)
			return p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: defaultWindow + 1})
		}, http2.ErrCodeFlowControl},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			p, done := attackServer(t, drain)
			p.check(tt.attack(p))
			err := ended(t, done)
			if !errors.Is(err, ErrProtocol) && !errors.Is(err, errFlowControl) {
				t.Errorf("connection ended with %v, want a protocol or flow-control error", err)
			}
			got := p.waitFor("GOAWAY", func(s seen) bool { return s.typ == http2.FrameGoAway })
			if got.code != tt.code {
				t.Errorf("GOAWAY %v, want %v", got.code, tt.code)
			}
			p.nc.Close()
			settle(t, base)
		})
	}
}

// TestSettingsApplyTheLastValue: a parameter repeated in one SETTINGS
// frame takes its last value (RFC 9113 §6.5.3), applied once.
func TestSettingsApplyTheLastValue(t *testing.T) {
	p, sc, _ := attackServerConn(t, Limits{}, block(t))
	p.check(p.headers(1))
	p.waitFor("CONNECT answered", func(s seen) bool { return s.typ == http2.FrameHeaders })
	p.check(p.fr.WriteSettings(
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 15},
	))
	p.sync()
	sc.c.mu.Lock()
	got := [3]int64{int64(sc.c.peerInitialWindow), int64(sc.c.peerMaxFrame), sc.c.streams[1].sendWindow}
	sc.c.mu.Unlock()
	if want := [3]int64{1 << 20, 1 << 15, 1 << 20}; got != want {
		t.Errorf("initial window, max frame, stream window = %v, want %v", got, want)
	}
}

// TestOversizedHeaderBlocks: a header block past MaxHeaderList, whether
// in one frame or in CONTINUATIONs without end, ends the connection with
// GOAWAY; so do CONTINUATIONs without payload, which never grow the
// block. The server holds about one frame meanwhile.
func TestOversizedHeaderBlocks(t *testing.T) {
	// literal is an HPACK literal field (never indexed), name "x-pad"
	// and a value of n bytes (n < 127), without Huffman coding.
	literal := func(n int) []byte {
		b := []byte{0x10, 5, 'x', '-', 'p', 'a', 'd', byte(n)}
		return append(b, bytes.Repeat([]byte{'a'}, n)...)
	}
	for _, tt := range []struct {
		name   string
		attack func(p *rawPeer) error
		want   error
		code   http2.ErrCode
	}{
		{"one HEADERS frame past the limit", func(p *rawPeer) error {
			p.hbuf.Reset()
			_ = p.henc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
			_ = p.henc.WriteField(hpack.HeaderField{Name: ":authority", Value: "10.0.0.1:80"})
			_ = p.henc.WriteField(hpack.HeaderField{Name: "x-pad", Value: string(bytes.Repeat([]byte{'a'}, MaxHeaderList)), Sensitive: true})
			return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.hbuf.Bytes(), EndHeaders: true})
		}, ErrProtocol, http2.ErrCodeProtocol},
		{"CONTINUATIONs without end", func(p *rawPeer) error {
			if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: literal(100)}); err != nil {
				return err
			}
			for range 100000 {
				if err := p.fr.WriteContinuation(1, false, bytes.Repeat(literal(100), 10)); err != nil {
					return err
				}
			}
			return nil
		}, ErrProtocol, http2.ErrCodeProtocol},
		{"empty CONTINUATIONs without end", func(p *rawPeer) error {
			if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: literal(100)}); err != nil {
				return err
			}
			for range 100000 {
				if err := p.fr.WriteContinuation(1, false, nil); err != nil {
					return err
				}
			}
			return nil
		}, ErrFlood, http2.ErrCodeEnhanceYourCalm},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			handled := make(chan struct{}, 1)
			p, done := attackServer(t, func(*Stream) { handled <- struct{}{} })
			go func() { _ = tt.attack(p) }()
			if err := ended(t, done); !errors.Is(err, tt.want) {
				t.Errorf("connection ended with %v, want %v", err, tt.want)
			}
			got := p.waitFor("GOAWAY", func(s seen) bool { return s.typ == http2.FrameGoAway })
			if got.code != tt.code {
				t.Errorf("GOAWAY %v, want %v", got.code, tt.code)
			}
			select {
			case <-handled:
				t.Error("the oversized request reached the handler")
			default:
			}
			p.nc.Close()
			settle(t, base)
		})
	}
}

// hostileServer returns a client stream (ID 1) to a raw server, and the
// server.
func hostileServer(t *testing.T, lim Limits) (*ClientConn, *Stream, *rawPeer) {
	t.Helper()
	cc, p := rawServer(t, lim)
	sc := make(chan *Stream, 1)
	go func() {
		s, err := cc.Connect(t.Context(), "10.0.0.1:80", nil)
		if err != nil {
			t.Error(err)
		}
		sc <- s
	}()
	p.waitFor("CONNECT", func(s seen) bool { return s.typ == http2.FrameHeaders && s.stream == 1 })
	p.check(p.respond(1, "200"))
	s := <-sc
	if s == nil {
		t.FailNow()
	}
	return cc, s, p
}

// TestHostileServer: the client's connection is held to the same limits
// as the server's.
func TestHostileServer(t *testing.T) {
	t.Run("tiny DATA frames", func(t *testing.T) {
		_, _, p := hostileServer(t, Limits{})
		before := heapInUse()
		for range 20000 {
			p.check(p.fr.WriteData(1, false, []byte{0}))
		}
		p.sync()
		if grew := int64(heapInUse()) - int64(before); grew > 2<<20 {
			t.Errorf("20,000 1-byte DATA frames grew the client's heap by %d bytes", grew)
		}
	})
	for _, tt := range []struct {
		name   string
		lim    Limits
		attack func(p *rawPeer) error
		want   error
		code   http2.ErrCode
	}{
		{"PING flood", Limits{}, func(p *rawPeer) error {
			for range 10000 {
				if err := p.fr.WritePing(false, [8]byte{}); err != nil {
					return err
				}
			}
			return nil
		}, ErrFlood, http2.ErrCodeEnhanceYourCalm},
		{"RST_STREAM for streams never opened", Limits{}, func(p *rawPeer) error {
			return p.fr.WriteRSTStream(99, http2.ErrCodeCancel)
		}, ErrProtocol, http2.ErrCodeProtocol},
		{"oversized response headers", Limits{}, func(p *rawPeer) error {
			p.hbuf.Reset()
			_ = p.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			_ = p.henc.WriteField(hpack.HeaderField{Name: "x-pad", Value: string(make([]byte, MaxHeaderList)), Sensitive: true})
			return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.hbuf.Bytes(), EndHeaders: true})
		}, ErrProtocol, http2.ErrCodeProtocol},
		{"empty DATA", Limits{}, func(p *rawPeer) error {
			for range 10000 {
				if err := p.fr.WriteData(1, false, nil); err != nil {
					return err
				}
			}
			return nil
		}, ErrFlood, http2.ErrCodeEnhanceYourCalm},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cc, s, p := hostileServer(t, tt.lim)
			go func() { _ = tt.attack(p) }()
			select {
			case <-cc.Done():
			case <-time.After(eventually.DefaultTimeout):
				t.Fatal("the client's connection did not end")
			}
			if _, err := s.Read(make([]byte, 1)); !errors.Is(err, tt.want) {
				t.Errorf("stream read = %v, want %v", err, tt.want)
			}
			got := p.waitFor("GOAWAY", func(s seen) bool { return s.typ == http2.FrameGoAway })
			if got.code != tt.code {
				t.Errorf("GOAWAY %v, want %v", got.code, tt.code)
			}
		})
	}
	t.Run("PING flood, never reading", func(t *testing.T) {
		a, b := net.Pipe()
		p := newRawPeer(t, b)
		go func() {
			// The client's preface and SETTINGS, then nothing.
			_, _ = io.ReadFull(b, make([]byte, len(http2.ClientPreface)))
			for f, err := p.fr.ReadFrame(); err == nil && f.Header().Type != http2.FrameWindowUpdate; f, err = p.fr.ReadFrame() {
			}
			_ = p.fr.WriteSettings()
			for range 1_000_000 {
				if p.fr.WritePing(false, [8]byte{}) != nil {
					return
				}
			}
		}()
		cc, err := NewClientConnWith(a, Limits{MaxControlQueue: 100, Pings: Rate{Burst: 1 << 30, PerSecond: 1 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-cc.Done():
		case <-time.After(eventually.DefaultTimeout):
			t.Fatal("the client's connection did not end")
		}
		if _, err := cc.Connect(t.Context(), "10.0.0.1:80", nil); !errors.Is(err, ErrFlood) {
			t.Errorf("Connect = %v, want ErrFlood", err)
		}
	})
}

// silentPeers is how many connections TestSilentTLSPeersAreCheap opens.
const silentPeers = 400

// maxSilentPeerBytes bounds what the server holds, heap and stack, per
// connection whose peer has sent nothing: its goroutine's stack, the
// socket, the handshake's state and deadline; no buffer.
const maxSilentPeerBytes = 16 << 10

// TestSilentTLSPeersAreCheap: anyone who can reach the server's port
// opens connections and never sends a ClientHello. Until the handshake's
// deadline each holds a goroutine and a few KiB, not the batched
// writer's 256 KiB, which is taken only once the peer is authenticated.
func TestSilentTLSPeersAreCheap(t *testing.T) {
	scfg, _ := testcerts.MutualTLS(t, "hbone")
	var waiting atomic.Int64
	addr := acceptEach(t, func(c net.Conn) {
		waiting.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if tc, err := ServerTLS(ctx, c, scfg); err == nil {
			tc.Close()
		}
	})
	time.Sleep(100 * time.Millisecond)
	measure()
	before := measure()
	for range silentPeers {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	eventually.True(t, "every connection waits for its peer", func() bool { return waiting.Load() == silentPeers })
	// The handlers park in their first read.
	time.Sleep(100 * time.Millisecond)
	after := measure()
	bytes := float64(after.bytes-before.bytes) / silentPeers
	stacks := float64(after.stacks-before.stacks) / silentPeers
	goroutines := float64(after.goroutines-before.goroutines) / silentPeers
	t.Logf("per silent peer: %.0f bytes (%.0f of them stacks), %.2f goroutines", bytes, stacks, goroutines)
	if bytes > maxSilentPeerBytes && !raceEnabled {
		t.Errorf("%.0f bytes per silent peer, want at most %d", bytes, maxSilentPeerBytes)
	}
	if goroutines > 1.05 {
		t.Errorf("%.2f goroutines per silent peer, want at most 1", goroutines)
	}
}
