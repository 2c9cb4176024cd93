package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
)

func serveTLS(t testing.TB, scfg *tls.Config, handler func(*Stream)) (string, chan *ServerConn) {
	l, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns := make(chan *ServerConn, 16)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			sc, _ := Serve(nc, handler)
			conns <- sc
		}
	}()
	return l.Addr().String(), conns
}

func echo(s *Stream) {
	if s.Request.Authority == "10.0.0.1:403" {
		_ = s.Respond(401, nil)
		return
	}
	if err := s.Respond(200, map[string]string{"baggage": "k8s.namespace.name=srv"}); err != nil {
		return
	}
	_, _ = io.Copy(s, s)
	_ = s.CloseWrite()
}

// pair returns a client connected to an echo server with the same CA.
func pair(t testing.TB) *ClientConn {
	t.Helper()
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	addr, _ := serveTLS(t, scfg, echo)
	return dial(t, addr, ccfg)
}

// dial opens a client connection to an HBONE server, closed with the test.
func dial(t testing.TB, addr string, ccfg *tls.Config) *ClientConn {
	t.Helper()
	nc, err := tls.Dial("tcp", addr, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	return clientOver(t, nc)
}

// clientOver is an HBONE client connection over nc, closed with the test.
func clientOver(t testing.TB, nc net.Conn) *ClientConn {
	t.Helper()
	cc, err := NewClientConn(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestEchoThroughTunnel(t *testing.T) {
	cc := pair(t)
	s, err := cc.Connect(t.Context(), "10.244.1.5:8080", [][2]string{{"forwarded", `for="10.244.2.3:4000"`}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.ResponseHeader()["baggage"]; got != "k8s.namespace.name=srv" {
		t.Errorf("response baggage %q", got)
	}
	// More than every window, so flow control has to work.
	payload := make([]byte, 40<<20)
	_, _ = rand.Read(payload)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Write(payload)
		errc <- errors.Join(err, s.CloseWrite())
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("echoed %d bytes, differ from the %d sent", len(got), len(payload))
	}
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for cc.Streams() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := cc.Streams(); n != 0 {
		t.Errorf("%d streams left after both sides finished", n)
	}
}

func TestManyStreams(t *testing.T) {
	cc := pair(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			s, err := cc.Connect(context.Background(), "10.244.1.5:8080", nil)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			payload := bytes.Repeat([]byte{byte(i)}, 1<<20+i)
			go func() { _, _ = s.Write(payload); _ = s.CloseWrite() }()
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, payload) {
				errs <- errors.Join(err, errors.New("stream data differs"))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStatusAndReset(t *testing.T) {
	cc := pair(t)
	_, err := cc.Connect(t.Context(), "10.0.0.1:403", nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 401 {
		t.Fatalf("Connect to a denied authority = %v, want 401", err)
	}
	// The connection stays usable.
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestServerResetIsSeen(t *testing.T) {
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	addr, _ := serveTLS(t, scfg, func(s *Stream) {
		_ = s.Respond(200, nil)
		buf := make([]byte, 5)
		_, _ = io.ReadFull(s, buf)
		s.Close() // reset mid-stream
	})
	cc := dial(t, addr, ccfg)
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = s.Write([]byte("hello"))
	if _, err := io.ReadAll(s); !errors.Is(err, ErrReset) {
		t.Errorf("read after the server's reset = %v, want ErrReset", err)
	}
}

func TestGoAwayDrains(t *testing.T) {
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	addr, conns := serveTLS(t, scfg, echo)
	cc := dial(t, addr, ccfg)
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := <-conns
	done := make(chan struct{})
	go func() { sc.Shutdown(5 * time.Second); close(done) }()
	for cc.Usable() {
		time.Sleep(time.Millisecond)
	}
	if _, err := cc.Connect(t.Context(), "10.244.1.5:80", nil); !errors.Is(err, ErrGoAway) {
		t.Errorf("Connect after GOAWAY = %v", err)
	}
	// The open stream still works until it ends.
	_, _ = s.Write([]byte("still here"))
	_ = s.CloseWrite()
	got, err := io.ReadAll(s)
	if string(got) != "still here" {
		t.Errorf("draining stream echoed %q, %v", got, err)
	}
	<-done
}

// TestGoAwayClosesWhenIdle: after GoAway the open stream is carried to
// its end, no new stream is taken, and the connection then closes by
// itself, with no deadline involved.
func TestGoAwayClosesWhenIdle(t *testing.T) {
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	l, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	type served struct {
		sc   *ServerConn
		done <-chan error
	}
	conns := make(chan served, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		sc, done := Serve(nc, echo)
		conns <- served{sc, done}
	}()
	cc := dial(t, l.Addr().String(), ccfg)
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := <-conns
	srv.sc.GoAway()
	srv.sc.GoAway() // a second call changes nothing
	eventually.True(t, "the client saw the GOAWAY", func() bool { return !cc.Usable() })
	if _, err := cc.Connect(t.Context(), "10.244.1.5:80", nil); !errors.Is(err, ErrGoAway) {
		t.Errorf("Connect after GOAWAY = %v, want ErrGoAway", err)
	}
	select {
	case err := <-srv.done:
		t.Fatalf("the connection ended with a stream open: %v", err)
	default:
	}
	_, _ = s.Write([]byte("still here"))
	_ = s.CloseWrite()
	if got, err := io.ReadAll(s); string(got) != "still here" {
		t.Errorf("draining stream echoed %q, %v", got, err)
	}
	select {
	case err := <-srv.done:
		if err != nil {
			t.Errorf("the connection ended with %v, want a normal end", err)
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing assertion
		t.Fatal("the connection stayed open after its last stream ended")
	}
}

// TestGoAwayWaitsForThePeer: a CONNECT the peer sent before it read our
// GOAWAY is refused (REFUSED_STREAM, which it may retry elsewhere), not
// met with a closed socket: an idle connection closes only once the peer
// has answered the PING that follows the GOAWAY. This is the race of a
// node proxy handing over (a connection accepted just before the drain
// gets GOAWAY while its client's first CONNECT is on the wire).
func TestGoAwayWaitsForThePeer(t *testing.T) {
	p, sc, done := attackServerConn(t, Limits{}, block(t))
	p.sync()
	sc.GoAway()
	p.waitFor("GOAWAY NO_ERROR", func(s seen) bool { return s.typ == http2.FrameGoAway && s.code == http2.ErrCodeNo })
	p.waitFor("a PING after the GOAWAY", func(s seen) bool { return s.typ == http2.FramePing && !s.ack })

	// The peer has not answered the PING: its CONNECT crossed the GOAWAY.
	p.check(p.headers(1))
	p.waitFor("the crossing CONNECT refused", func(s seen) bool {
		return s.typ == http2.FrameRSTStream && s.stream == 1 && s.code == http2.ErrCodeRefusedStream
	})
	select {
	case err := <-done:
		t.Fatalf("the connection ended before the peer answered the PING: %v", err)
	default:
	}

	p.check(p.fr.WritePing(true, goAwayPing))
	if err := ended(t, done); err != nil {
		t.Errorf("the connection ended with %v, want a normal end", err)
	}
}

// TestCloseWhenIdleKeepsOpenStreams: a client connection taken out of
// use (its peer is draining) refuses new streams, carries the open one to
// its end and only then closes.
func TestCloseWhenIdleKeepsOpenStreams(t *testing.T) {
	cc := pair(t)
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	cc.CloseWhenIdle()
	cc.CloseWhenIdle() // a second call changes nothing
	if cc.Usable() {
		t.Error("Usable after CloseWhenIdle")
	}
	if _, err := cc.Connect(t.Context(), "10.244.1.5:80", nil); err == nil {
		t.Error("Connect after CloseWhenIdle succeeded")
	}
	select {
	case <-cc.Done():
		t.Fatal("closed with a stream open")
	default:
	}
	_, _ = s.Write([]byte("still here"))
	_ = s.CloseWrite()
	if got, err := io.ReadAll(s); string(got) != "still here" {
		t.Errorf("the open stream echoed %q, %v", got, err)
	}
	_ = s.Close()
	select {
	case <-cc.Done():
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing assertion
		t.Fatal("still open after its last stream ended")
	}
}

// TestInterop checks the wire against net/http's HTTP/2, an independent
// implementation: its client against our server, ours against its server.
func TestInterop(t *testing.T) {
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	t.Run("net/http client, our server", func(t *testing.T) {
		addr, _ := serveTLS(t, scfg, echo)
		protos := new(http.Protocols)
		protos.SetHTTP2(true)
		tr := &http.Transport{TLSClientConfig: ccfg, Protocols: protos}
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodConnect, "https://"+addr, pr)
		req.Host = "10.244.1.5:8080"
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		go func() { _, _ = pw.Write([]byte("ping")); pw.Close() }()
		got, _ := io.ReadAll(resp.Body)
		if string(got) != "ping" {
			t.Errorf("echo %q", got)
		}
		// A GET is refused with 400.
		req, _ = http.NewRequest(http.MethodGet, "https://"+addr+"/x", nil)
		resp, err = tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 400 {
			t.Errorf("GET = %v, %v; want 400", resp, err)
		}
	})
	t.Run("our client, net/http server", func(t *testing.T) {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodConnect || r.Host != "10.244.1.5:8080" {
				w.WriteHeader(400)
				return
			}
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Body.Read(buf)
				if n > 0 {
					_, _ = w.Write(buf[:n])
					w.(http.Flusher).Flush()
				}
				if err != nil {
					return
				}
			}
		})}
		protos := new(http.Protocols)
		protos.SetHTTP2(true)
		srv.Protocols = protos
		srv.TLSConfig = scfg.Clone()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.ServeTLS(l, "", "")
		defer srv.Close()
		cc := dial(t, l.Addr().String(), ccfg)
		s, err := cc.Connect(t.Context(), "10.244.1.5:8080", nil)
		if err != nil {
			t.Fatal(err)
		}
		payload := bytes.Repeat([]byte("x"), 3<<20)
		go func() { _, _ = s.Write(payload); _ = s.CloseWrite() }()
		got, err := io.ReadAll(s)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("echo through net/http's server: %d bytes, %v", len(got), err)
		}
	})
}

// FuzzServerFrames feeds arbitrary bytes after a valid preface: the
// server never panics, ends the connection once the input does, and
// leaves no goroutine behind.
func FuzzServerFrames(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 5, 1, 5, 0, 0, 0, 1, 0x82, 0x84, 0x86, 0x41, 0x8a})
	// A well-formed session to mutate: SETTINGS, a CONNECT with a
	// CONTINUATION, DATA, PING, WINDOW_UPDATE, RST_STREAM.
	var session bytes.Buffer
	fr := http2.NewFramer(&session, nil)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	_ = enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	_ = enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "10.0.0.1:80"})
	_ = enc.WriteField(hpack.HeaderField{Name: "baggage", Value: "k=v"})
	block := hbuf.Bytes()
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:4]})
	_ = fr.WriteContinuation(1, true, block[4:])
	_ = fr.WriteData(1, false, []byte("hello"))
	_ = fr.WritePing(false, [8]byte{1})
	_ = fr.WriteWindowUpdate(0, 1000)
	_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
	f.Add(session.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		base := runtime.NumGoroutine()
		a, b := net.Pipe()
		_, done := ServeWith(b, Limits{HandshakeTimeout: time.Second}, func(s *Stream) { s.Close() })
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, a); close(drained) }()
		_, _ = a.Write([]byte(http2.ClientPreface))
		_, _ = a.Write(data)
		a.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("server did not end")
		}
		<-drained
		eventually.True(t, "goroutines back to their number before", func() bool { return runtime.NumGoroutine() <= base })
	})
}

// TestPeerIgnoringWindowsIsCut: a client that sends past the stream
// window gets the stream reset with FLOW_CONTROL_ERROR, and the server
// buffers no more than the window.
func TestPeerIgnoringWindowsIsCut(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	Serve(b, func(s *Stream) { _ = s.Respond(200, nil) }) // never reads
	fr := http2.NewFramer(a, a)
	frames := make(chan http2.Frame, 64)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(frames)
				return
			}
			if rst, ok := f.(*http2.RSTStreamFrame); ok {
				frames <- rst
			}
		}
	}()
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	_ = enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	_ = enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "10.0.0.1:80"})
	_, _ = a.Write([]byte(http2.ClientPreface))
	_ = fr.WriteSettings()
	_ = fr.WriteWindowUpdate(0, 1<<30) // let the server answer freely
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndHeaders: true})
	chunk := make([]byte, 16384)
	go func() {
		for i := 0; i < (StreamWindow/16384)+8; i++ {
			if fr.WriteData(1, false, chunk) != nil {
				return
			}
		}
	}()
	select {
	case f, ok := <-frames:
		if !ok {
			t.Fatal("connection ended without a reset")
		}
		if rst := f.(*http2.RSTStreamFrame); rst.ErrCode != http2.ErrCodeFlowControl || rst.StreamID != 1 {
			t.Errorf("got %v", rst)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no RST_STREAM for a stream past its window")
	}
}
