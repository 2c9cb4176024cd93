package hbone

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
)

// echoApp is an app that echoes each connection's bytes, reading slowly
// when slow is set (so that the tunnel's sink queues and drains).
func echoApp(t *testing.T, slow bool) string {
	t.Helper()
	return acceptEach(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			if slow {
				time.Sleep(time.Millisecond)
			}
			n, err := c.Read(buf)
			if _, werr := c.Write(buf[:n]); werr != nil || err != nil {
				_ = c.(*net.TCPConn).CloseWrite()
				return
			}
		}
	})
}

// TestSpliceCarriesBothWays: bytes through both ends' Splice arrive
// whole and in order, with the app reading fast or slowly, and the
// half-closes pass through.
func TestSpliceCarriesBothWays(t *testing.T) {
	for _, slow := range []bool{false, true} {
		via := tunnel(t, echoApp(t, slow))
		c, err := net.Dial("tcp", via)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 8<<20+123)
		_, _ = rand.Read(want)
		go func() {
			_, _ = c.Write(want)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("slow=%v: got %d bytes (%v), want the %d sent", slow, len(got), err, len(want))
		}
	}
}

// TestSpliceEndsWhenTheStreamIsReset: a stream reset while its app
// connection is idle ends Splice: the app reads EOF, and Splice returns
// once the app closes.
func TestSpliceEndsWhenTheStreamIsReset(t *testing.T) {
	spliceEnds(t, func(s *Stream) { s.c.removeStream(s.id, ErrReset) }, ErrReset)
}

// TestSpliceHonoursTheReadDeadline: a stream's read deadline passing
// while Splice waits ends the stream's direction as a reset does.
func TestSpliceHonoursTheReadDeadline(t *testing.T) {
	spliceEnds(t, func(s *Stream) { _ = s.SetReadDeadline(time.Now().Add(10 * time.Millisecond)) }, os.ErrDeadlineExceeded)
}

// spliceEnds splices an idle app connection with a stream, ends the
// stream's direction with end, and checks that the app reads EOF and
// that Splice returns want once the app closes.
func spliceEnds(t *testing.T, end func(*Stream), want error) {
	cc := pair(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	s, err := cc.Connect(t.Context(), "10.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := Splice(<-accepted, s)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // Splice is waiting, idle
	end(s)
	// The app sees the end of the stream's direction...
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("app read %v, want EOF", err)
	}
	// ...and Splice returns once the app closes.
	client.Close()
	select {
	case err := <-done:
		if !errors.Is(err, want) {
			t.Errorf("Splice: %v, want %v", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Splice did not return")
	}
}

// sinkApp accepts connections and never reads them.
func sinkApp(t *testing.T) string {
	t.Helper()
	return holdingServer(t, func(net.Conn) {})
}

// TestAppThatDoesNotReadHoldsAWindow: a peer streaming to an app that
// does not read makes the server end hold about the stream's window
// (what the app's socket took aside), and the read loop, which writes
// through to apps without waiting, goes on serving the connection's
// other streams.
func TestAppThatDoesNotReadHoldsAWindow(t *testing.T) {
	stuck, echoAddr := sinkApp(t), echoApp(t, false)
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	addr, _ := serveTLS(t, scfg, func(s *Stream) {
		up, err := net.Dial("tcp", s.Request.Authority)
		if err != nil {
			_ = s.Respond(503, nil)
			return
		}
		_ = s.Respond(200, nil)
		_, _, _ = Splice(up, s)
	})
	cc := dial(t, addr, ccfg)
	payload := make([]byte, 3*StreamWindow)
	before := heapInUse()
	s, err := cc.Connect(t.Context(), stuck, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sent := make(chan int64, 1)
	go func() {
		// Past the window: Write blocks once the server stops crediting.
		n, _ := s.Write(payload)
		sent <- int64(n)
	}()
	time.Sleep(500 * time.Millisecond)
	// The connection's other streams go on.
	e, err := cc.Connect(t.Context(), echoAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	msg := []byte("still served")
	if _, err := e.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = e.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(e, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo through the same connection: %q, %v", got, err)
	}
	held := int64(heapInUse()) - int64(before)
	t.Logf("held for the stream whose app does not read: %d bytes", held)
	// A window of chunks, one of them partly filled, and the buffers the
	// connections' TLS grew for 1 MiB frames.
	if max := int64(StreamWindow + 2<<20); held > max && !raceEnabled {
		t.Errorf("the server end holds %d bytes for a stream whose app does not read, want at most %d", held, max)
	}
	select {
	case n := <-sent:
		t.Fatalf("a write of %d bytes to an app that does not read returned: %d sent", 3*StreamWindow, n)
	default:
	}
}
