package hbone

import (
	"context"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// ClientConn is the client side of one HBONE connection.
type ClientConn struct{ c *conn }

// NewClientConn starts HTTP/2 on nc, an established mTLS connection
// (ALPN h2).
func NewClientConn(nc net.Conn) (*ClientConn, error) {
	return NewClientConnWith(nc, DefaultLimits())
}

// NewClientConnWith is NewClientConn with limits other than
// DefaultLimits.
func NewClientConnWith(nc net.Conn, lim Limits) (*ClientConn, error) {
	c := newConn(nc, true, lim)
	// The server's SETTINGS (the read loop checks for them) have
	// HandshakeTimeout.
	_ = nc.SetReadDeadline(time.Now().Add(c.lim.HandshakeTimeout))
	if err := c.handshake(); err != nil {
		nc.Close()
		return nil, err
	}
	go c.readLoop()
	return &ClientConn{c: c}, nil
}

// Connect opens a tunnel to authority ("<ip>:<port>") with the extra headers
// (wire contract §5.3: baggage, forwarded, traceparent) and waits for the
// answer: a *StatusError for anything but 200. The wait ends with ctx
// or after Limits.ConnectTimeout, whichever comes first.
func (cc *ClientConn) Connect(ctx context.Context, authority string, header [][2]string) (*Stream, error) {
	c := cc.c
	ctx, cancel := context.WithTimeout(ctx, c.lim.ConnectTimeout)
	defer cancel()
	fields := append([][2]string{{":method", "CONNECT"}, {":authority", authority}}, header...)
	var s *Stream
	// Stream IDs must reach the peer in increasing order: allocate the ID
	// and write its HEADERS under the same write lock.
	err := c.writeFrames(func() error {
		c.mu.Lock()
		if err := c.err; err != nil {
			c.mu.Unlock()
			return refused{err}
		}
		if c.goAway {
			c.mu.Unlock()
			return refused{ErrGoAway}
		}
		id := c.nextID
		c.nextID += 2
		s = c.newStreamLocked(id)
		maxFrame := c.peerMaxFrame
		c.mu.Unlock()
		block := c.encodeHeaders(fields)
		if uint32(len(block)) > maxFrame {
			return fmt.Errorf("header block of %d bytes", len(block)) // HPACK state moved: fatal
		}
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
	})
	if err != nil {
		if s != nil {
			c.removeStream(s.id, err)
		}
		return nil, err
	}
	if err := s.awaitResponse(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Streams is the number of open streams.
func (cc *ClientConn) Streams() int {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return len(cc.c.streams)
}

// Usable reports whether new streams may be opened.
func (cc *ClientConn) Usable() bool {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return cc.c.err == nil && !cc.c.goAway && cc.c.nextID < 1<<31-1
}

// IdleFor is how long the connection has had no stream (0 while busy).
func (cc *ClientConn) IdleFor() time.Duration {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	if len(cc.c.streams) > 0 {
		return 0
	}
	return time.Since(cc.c.idleSince)
}

// Done is closed when the connection has ended.
func (cc *ClientConn) Done() <-chan struct{} { return cc.c.done }

// CloseWhenIdle takes the connection out of use (Connect refuses, Usable
// is false) and closes it once its open streams have ended. A connection
// the peer sent GOAWAY on still carries the streams the peer kept, which
// Close would cut. Calling it again is a no-op.
func (cc *ClientConn) CloseWhenIdle() {
	c := cc.c
	c.mu.Lock()
	if c.draining || c.err != nil {
		c.mu.Unlock()
		return
	}
	// The server opens no stream: nothing it sends is waited for.
	c.draining, c.goAway, c.goAwaySeen = true, true, true
	c.mu.Unlock()
	go c.closeWhenIdle(ErrConnClosed)
}

// Close ends the connection and its streams.
func (cc *ClientConn) Close() error {
	cc.c.fail(ErrConnClosed)
	return nil
}
