package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
)

// short is a timeout the tests wait out; they assert what happens after
// it, never how soon.
const short = 50 * time.Millisecond

func TestServerHandshakeTimeout(t *testing.T) {
	for _, tt := range []struct {
		name string
		send func(p *rawPeer)
		want error
	}{
		{"no preface", func(*rawPeer) {}, ErrHandshakeTimeout},
		{"a preface, no SETTINGS", func(p *rawPeer) {
			p.write([]byte(http2.ClientPreface))
		}, ErrHandshakeTimeout},
		{"a PING before SETTINGS", func(p *rawPeer) {
			p.write([]byte(http2.ClientPreface))
			p.check(p.fr.WritePing(false, [8]byte{}))
		}, ErrProtocol},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			_, done := ServeWith(b, Limits{HandshakeTimeout: short}, block(t))
			p := newRawPeer(t, a)
			p.read()
			tt.send(p)
			if err := ended(t, done); !errors.Is(err, tt.want) {
				t.Errorf("connection ended with %v, want %v", err, tt.want)
			}
		})
	}
}

func TestClientHandshakeTimeout(t *testing.T) {
	a, b := net.Pipe()
	p := newRawPeer(t, b)
	go func() {
		// The client's preface and SETTINGS; no SETTINGS back.
		if _, err := io.ReadFull(b, make([]byte, len(http2.ClientPreface))); err == nil {
			p.read()
		}
	}()
	cc, err := NewClientConnWith(a, Limits{HandshakeTimeout: short})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-cc.Done():
	case <-time.After(eventually.DefaultTimeout):
		t.Fatal("the client waits for the server's SETTINGS forever")
	}
	if _, err := cc.Connect(t.Context(), "10.0.0.1:80", nil); !errors.Is(err, ErrHandshakeTimeout) {
		t.Errorf("Connect = %v, want ErrHandshakeTimeout", err)
	}
}

func TestIdleTimeout(t *testing.T) {
	t.Run("idle connection", func(t *testing.T) {
		p, done := attackServerWith(t, Limits{IdleTimeout: short}, block(t))
		if err := ended(t, done); err != nil {
			t.Errorf("idle connection ended with %v, want nil", err)
		}
		p.waitFor("GOAWAY NO_ERROR", func(s seen) bool { return s.typ == http2.FrameGoAway && s.code == http2.ErrCodeNo })
	})
	t.Run("connection with a stream", func(t *testing.T) {
		p, sc, done := attackServerConn(t, Limits{IdleTimeout: short}, block(t))
		p.check(p.headers(1))
		p.waitFor("CONNECT answered", func(s seen) bool { return s.typ == http2.FrameHeaders })
		eventually.True(t, "idle timer ran thrice", func() bool { return sc.c.idleChecks.Load() >= 3 })
		select {
		case err := <-done:
			t.Fatalf("connection with a stream ended (%v)", err)
		default:
		}
		p.sync() // still served
	})
}

// rawServer answers a client's handshake with SETTINGS and then does
// what the test says: for clients facing a hostile server.
func rawServer(t *testing.T, lim Limits) (*ClientConn, *rawPeer) {
	t.Helper()
	a, b := net.Pipe()
	p := newRawPeer(t, b)
	go func() {
		if _, err := io.ReadFull(b, make([]byte, len(http2.ClientPreface))); err == nil {
			p.read()
		}
	}()
	cc, err := NewClientConnWith(a, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	p.check(p.fr.WriteSettings())
	return cc, p
}

func TestConnectTimeout(t *testing.T) {
	cc, _ := rawServer(t, Limits{ConnectTimeout: short})
	errc := make(chan error, 1)
	go func() {
		_, err := cc.Connect(context.Background(), "10.0.0.1:80", nil)
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Connect = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(eventually.DefaultTimeout):
		t.Fatal("Connect waits for an answer forever")
	}
	if n := cc.Streams(); n != 0 {
		t.Errorf("%d streams left after the timeout", n)
	}
}

// TestWriteTimeout: a peer that stops reading ends the connection once
// a write has made no progress for WriteTimeout.
func TestWriteTimeout(t *testing.T) {
	a, b := net.Pipe()
	_, done := ServeWith(b, Limits{WriteTimeout: short}, func(s *Stream) {
		_ = s.Respond(200, nil)
		_, _ = s.Write(make([]byte, 1<<20))
	})
	p := newRawPeer(t, a)
	p.write([]byte(http2.ClientPreface))
	p.readHandshake()
	// From here on, nothing is read.
	p.check(p.fr.WriteSettings())
	p.check(p.headers(1))
	if err := ended(t, done); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection ended with %v, want os.ErrDeadlineExceeded", err)
	}
}

func TestTLSHandshakeTimeout(t *testing.T) {
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	server := func(ctx context.Context, raw net.Conn) error {
		_, err := handshakeTLS(ctx, raw, scfg, true, short)
		return err
	}
	for _, tt := range []struct {
		name string
		run  func(ctx context.Context, raw net.Conn) error
		// tcp: over a loopback TCP connection, where a server waits for
		// the peer's first byte before its TLS state exists (a pipe is
		// not waited for); sent is what the peer sends, then nothing.
		tcp  bool
		sent []byte
		// cancel: the caller's context is cancelled long before its
		// deadline.
		cancel bool
		want   error
	}{
		{name: "server", run: server, want: context.DeadlineExceeded},
		{name: "client", run: func(ctx context.Context, raw net.Conn) error {
			_, err := handshakeTLS(ctx, raw, ccfg, false, short)
			return err
		}, want: context.DeadlineExceeded},
		{name: "server over TCP, nothing sent", run: server, tcp: true, want: context.DeadlineExceeded},
		{name: "server over TCP, a record header sent", run: server, tcp: true, sent: []byte{22, 3, 1, 0, 200}, want: context.DeadlineExceeded},
		{name: "server over TCP, cancelled", run: server, tcp: true, cancel: true, want: context.Canceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			if tt.tcp {
				a, b = tcpPair(t)
			}
			t.Cleanup(func() { a.Close() })
			go func() { _, _ = a.Read(make([]byte, 1<<16)) }() // a peer that says nothing more
			if len(tt.sent) > 0 {
				if _, err := a.Write(tt.sent); err != nil {
					t.Fatal(err)
				}
			}
			ctx := context.Background()
			if tt.cancel {
				// Its deadline, a minute, is not waited for.
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				t.Cleanup(cancel)
				time.AfterFunc(short, cancel)
			}
			errc := make(chan error, 1)
			go func() { errc <- tt.run(ctx, b) }()
			select {
			case err := <-errc:
				if !errors.Is(err, tt.want) {
					t.Errorf("handshake with a silent peer = %v, want %v", err, tt.want)
				}
			case <-time.After(eventually.DefaultTimeout):
				t.Fatal("the handshake waits for a silent peer forever")
			}
		})
	}
}

// tcpPair is both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}
