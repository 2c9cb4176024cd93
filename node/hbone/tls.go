package hbone

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// batchSize is batchConn's buffer: 16 full TLS records.
const batchSize = 256 << 10

// batchConn buffers writes below TLS once the handshake is done: a 1 MiB
// DATA frame becomes 64 TLS records, and without it 64 write syscalls.
// The HTTP/2 layer flushes it after its own flush.
//
// The buffer is taken at the first write after the handshake, never
// before: on a server, anyone who can reach the port can open
// connections that never finish the handshake, and each would otherwise
// hold 256 KiB until the handshake's deadline (400 such connections held
// 101 MiB).
type batchConn struct {
	net.Conn
	on atomic.Bool
	mu sync.Mutex
	w  *bufio.Writer // nil until the first write after the handshake
}

func (b *batchConn) Write(p []byte) (int, error) {
	if !b.on.Load() {
		return b.Conn.Write(p)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.w == nil {
		b.w = bufio.NewWriterSize(b.Conn, batchSize)
	}
	return b.w.Write(p)
}

func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.w == nil {
		return nil
	}
	return b.w.Flush()
}

// tlsConn is a TLS connection over a batchConn.
type tlsConn struct {
	*tls.Conn
	raw *batchConn
}

// Flush pushes batched records to the socket.
func (t *tlsConn) Flush() error { return t.raw.flush() }

// flusher is a connection with batched writes below it.
type flusher interface{ Flush() error }

// TLSHandshakeTimeout bounds ClientTLS's and ServerTLS's handshake when
// their context has no deadline: a peer that connects and says nothing
// must not hold a connection (and its goroutine) forever.
const TLSHandshakeTimeout = 10 * time.Second

// ClientTLS runs the client handshake on raw and returns the connection to
// give NewClientConn. cfg should require TLS 1.3 and ALPN h2
// (wire contract §5.2). Without a deadline in ctx, the handshake has
// TLSHandshakeTimeout.
func ClientTLS(ctx context.Context, raw net.Conn, cfg *tls.Config) (net.Conn, error) {
	return handshakeTLS(ctx, raw, cfg, false, TLSHandshakeTimeout)
}

// ServerTLS runs the server handshake on raw. On a socket it makes no TLS
// state (cfg's GetConfigForClient is not called either) until the client
// has sent something, so a peer that connects and says nothing holds
// only the socket and the caller's goroutine. Without a deadline in ctx,
// the handshake has TLSHandshakeTimeout.
func ServerTLS(ctx context.Context, raw net.Conn, cfg *tls.Config) (net.Conn, error) {
	return handshakeTLS(ctx, raw, cfg, true, TLSHandshakeTimeout)
}

// handshakeTLS runs either side's handshake, within timeout if ctx has
// no deadline; raw is closed when it fails.
func handshakeTLS(ctx context.Context, raw net.Conn, cfg *tls.Config, server bool, timeout time.Duration) (net.Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if server {
		if err := awaitClient(ctx, raw); err != nil {
			raw.Close()
			return nil, err
		}
	}
	b := &batchConn{Conn: raw}
	var c *tls.Conn
	if server {
		c = tls.Server(b, cfg)
	} else {
		c = tls.Client(b, cfg)
	}
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	b.on.Store(true)
	return &tlsConn{Conn: c, raw: b}, nil
}

// awaitClient waits, within ctx, until the client has sent something
// (its ClientHello): until then a server's connection holds no TLS
// state, only its socket and its goroutine, whatever the number of
// peers that connect and say nothing.
func awaitClient(ctx context.Context, raw net.Conn) error {
	deadline, _ := ctx.Deadline()
	if err := raw.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("hbone: wait for the ClientHello: %w", err)
	}
	// A context cancelled before its deadline ends the wait too.
	stop := context.AfterFunc(ctx, func() { _ = raw.SetReadDeadline(time.Now()) })
	err := awaitPeer(raw)
	stop()
	_ = raw.SetReadDeadline(time.Time{})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("hbone: wait for the ClientHello: %w", ctx.Err())
	case isTimeout(err):
		// The socket's deadline, which is ctx's, can pass a moment
		// before ctx says so.
		return fmt.Errorf("hbone: wait for the ClientHello: %w", context.DeadlineExceeded)
	}
	return fmt.Errorf("hbone: wait for the ClientHello: %w", err)
}
