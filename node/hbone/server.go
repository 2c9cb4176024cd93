package hbone

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// ServerConn is the server side of one HBONE connection.
type ServerConn struct{ c *conn }

// Serve runs HTTP/2 on nc, an established mTLS connection, calling
// handler in its own goroutine for each valid CONNECT; the handler must
// Respond and, after a 200, carry the stream. Malformed requests are
// answered 400 here. Serve returns at once; the channel receives the
// connection's error (nil for a normal end) when it ends.
func Serve(nc net.Conn, handler func(*Stream)) (*ServerConn, <-chan error) {
	return ServeWith(nc, DefaultLimits(), handler)
}

// ServeWith is Serve with limits other than DefaultLimits.
func ServeWith(nc net.Conn, lim Limits, handler func(*Stream)) (*ServerConn, <-chan error) {
	c := newConn(nc, false, lim)
	c.onStream = handler
	sc := &ServerConn{c: c}
	done := make(chan error, 1)
	go func() { done <- c.serve() }()
	return sc, done
}

// serve runs the server side: the client preface, our SETTINGS, then
// frames until the connection ends, whose error it returns (nil for a
// normal end).
func (c *conn) serve() error {
	// The preface and the first SETTINGS frame after it (the read loop
	// checks that one) have HandshakeTimeout.
	_ = c.nc.SetReadDeadline(time.Now().Add(c.lim.HandshakeTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	_, err := io.ReadFull(c.nc, preface)
	switch {
	case isTimeout(err):
		c.fail(fmt.Errorf("%w: %w", ErrHandshakeTimeout, err))
	case err != nil:
		c.fail(fmt.Errorf("hbone: read the client preface: %w", err))
	case string(preface) != http2.ClientPreface:
		c.fail(fmt.Errorf("%w: no HTTP/2 client preface", ErrProtocol))
	default:
		if err := c.handshake(); err == nil {
			c.readLoop()
		}
	}
	c.mu.Lock()
	err = c.err
	c.mu.Unlock()
	if errors.Is(err, ErrConnClosed) {
		return nil
	}
	return err
}

// GoAway sends GOAWAY NO_ERROR: the peer opens no new stream here, and
// one it sent meanwhile is refused (REFUSED_STREAM), which it may retry on
// another connection. The streams already open are carried as before; the
// connection closes itself once the last of them and its handler are done
// and the peer has read the GOAWAY (goAwayGracefully). Nothing is cut: a
// caller that cannot wait for ever closes the connection itself
// (Shutdown does, after a grace period). Calling it again is a no-op.
func (sc *ServerConn) GoAway() {
	c := sc.c
	c.mu.Lock()
	if c.draining || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.draining = true
	// Read under the same lock that refuses new streams, so the GOAWAY
	// never reports a stream it refused as processed.
	c.goAway = true
	last := c.lastPeerStream
	c.mu.Unlock()
	c.goAwayGracefully(last, ErrConnClosed)
}

// goAwayPing is the payload of the PING that follows our GOAWAY.
var goAwayPing = [8]byte{'g', 'o', 'a', 'w', 'a', 'y'}

// goAwayAckTimeout bounds the wait for the peer to answer the PING that
// follows our GOAWAY: one that does not answer is closed without it.
const goAwayAckTimeout = time.Second

// goAwayGracefully tells the peer to open no new stream (GOAWAY NO_ERROR
// reporting last as processed) and closes the connection with why once
// its streams and handlers are done and the peer has read the GOAWAY.
// Callers have set goAway and draining.
//
// Why wait for the peer: a CONNECT it sent before reading the GOAWAY may
// still be on its way. Closing the socket with it unread resets the TCP
// connection, and the peer sees a broken connection instead of a refused
// stream, which it cannot tell from a failure mid-stream. A PING written
// after the GOAWAY is answered only once the peer has read the GOAWAY,
// so every CONNECT it sent before has arrived (and been refused) when
// the answer does, and it sends none after. A client's peer (a server)
// opens no stream: it is not waited for.
func (c *conn) goAwayGracefully(last uint32, why error) {
	if c.isClient {
		c.peerSawGoAway()
	}
	_ = c.writeFrames(func() error {
		if err := c.fr.WriteGoAway(last, http2.ErrCodeNo, nil); err != nil {
			return err
		}
		if !c.isClient {
			if err := c.fr.WritePing(false, goAwayPing); err != nil {
				return err
			}
		}
		return c.flushLocked()
	})
	go c.closeWhenIdle(why)
}

// closeWhenIdle closes a draining connection with why once no stream and
// no handler is left and the peer has seen our GOAWAY (peerSawGoAway, or
// goAwayAckTimeout passed); the condition is broadcast when a stream
// goes, a handler returns, the PING is answered or the connection ends.
func (c *conn) closeWhenIdle(why error) {
	t := time.AfterFunc(goAwayAckTimeout, func() { c.peerSawGoAway() })
	defer t.Stop()
	c.mu.Lock()
	for c.err == nil && (len(c.streams) > 0 || c.handlers > 0 || !c.goAwaySeen) {
		c.cond.Wait()
	}
	open := c.err == nil
	c.mu.Unlock()
	if open {
		c.fail(why)
	}
}

// peerSawGoAway records that the peer read our GOAWAY (or that it is no
// longer waited for).
func (c *conn) peerSawGoAway() {
	c.mu.Lock()
	c.goAwaySeen = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Shutdown sends GOAWAY (no new streams) and closes the connection once
// its streams are done or after grace.
func (sc *ServerConn) Shutdown(grace time.Duration) {
	c := sc.c
	sc.GoAway()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
	c.fail(ErrConnClosed)
}

// Streams is the number of open streams.
func (sc *ServerConn) Streams() int {
	sc.c.mu.Lock()
	defer sc.c.mu.Unlock()
	return len(sc.c.streams)
}
