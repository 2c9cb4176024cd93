package proxy

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/canopy-mesh/canopy/node/hbone"
)

// Limits bound what the proxy spends on connections, so that no pod and no
// peer can exhaust the descriptors and memory every pod of the node
// depends on.
type Limits struct {
	// MaxConnections is how many accepted connections (15001, 15006 and
	// 15008 together) the proxy holds open at once, node-wide.
	MaxConnections int
	// MaxConnectionsPerPod is the same bound for one pod's listeners.
	MaxConnectionsPerPod int
	// HandshakeTimeout bounds an inbound mTLS handshake on 15008.
	HandshakeTimeout time.Duration
	// MaxPendingHandshakes is how many inbound connections on 15008 may
	// be waiting for their peer to be authenticated (accepted, mTLS
	// handshake not done) at once, node-wide. When that many are, a new
	// connection takes the slot of the oldest, which is closed: under a
	// flood from many addresses each handshake keeps at least the time
	// the flood takes to open that many connections, which a peer that
	// speaks needs a few milliseconds of, rather than new peers being
	// refused until the silent ones time out.
	MaxPendingHandshakes int
	// MaxPendingHandshakesPerSource is the same bound for one source
	// address, node-wide (over every pod); a connection past it is
	// closed at once. It keeps one address from holding the node's
	// pending handshakes, and so from evicting other peers'.
	MaxPendingHandshakesPerSource int
	// DialTimeout bounds an outbound connection's set-up: the TCP dial,
	// and for HBONE the mTLS handshake with the peer.
	DialTimeout time.Duration
	// ConnectTimeout bounds the wait for a CONNECT's answer.
	ConnectTimeout time.Duration
	// HBONE bounds each HBONE connection, either side (streams, control
	// frames, idle and write timeouts); zero fields take
	// hbone.DefaultLimits.
	HBONE hbone.Limits
}

// DefaultLimits are the limits a Proxy has unless told otherwise. Each
// proxied connection holds two or three descriptors: the defaults keep a
// node proxy well inside a container's usual 1,048,576.
func DefaultLimits() Limits {
	return Limits{
		MaxConnections:       100_000,
		MaxConnectionsPerPod: 20_000,
		HandshakeTimeout:     10 * time.Second,
		// Istio's node proxy has neither bound, only a handshake
		// timeout. A peer's handshake is pending for a few
		// milliseconds, so a source has many at once only in a burst of
		// new pooled connections: a node proxy's pool opens one per
		// concurrent first connection to a destination, and a waypoint
		// opens them from one address to every pod of the node. 256 at
		// once from one address is a burst of new connections larger
		// than the upgrade test's (64) four times over; 4,096 node-wide
		// (16 addresses at their bound) holds, at about 4 KiB each before
		// the peer speaks, 16 MiB.
		MaxPendingHandshakes:          4096,
		MaxPendingHandshakesPerSource: 256,
		DialTimeout:                   10 * time.Second,
		ConnectTimeout:                10 * time.Second,
		HBONE:                         hbone.DefaultLimits(),
	}
}

// withDefaults fills zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxConnections <= 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.MaxConnectionsPerPod <= 0 {
		l.MaxConnectionsPerPod = d.MaxConnectionsPerPod
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = d.HandshakeTimeout
	}
	if l.MaxPendingHandshakes <= 0 {
		l.MaxPendingHandshakes = d.MaxPendingHandshakes
	}
	if l.MaxPendingHandshakesPerSource <= 0 {
		l.MaxPendingHandshakesPerSource = d.MaxPendingHandshakesPerSource
	}
	if l.DialTimeout <= 0 {
		l.DialTimeout = d.DialTimeout
	}
	if l.ConnectTimeout <= 0 {
		l.ConnectTimeout = d.ConnectTimeout
	}
	return l
}

// counter counts open connections against a bound given at each acquire
// (the limits can be set after the proxy is made).
type counter struct {
	mu sync.Mutex
	n  int
}

// acquire takes a slot; false when max are taken.
func (c *counter) acquire(max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= max {
		return false
	}
	c.n++
	return true
}

func (c *counter) release() {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
}

func (c *counter) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// handshakes are the inbound HBONE connections whose peer is not
// authenticated yet (accepted on 15008, mTLS handshake not done),
// node-wide, oldest first, with their count by source address; safe for
// concurrent use.
type handshakes struct {
	mu       sync.Mutex
	order    list.List // of *handshake
	bySource map[netip.Addr]int
}

// handshake is one connection in handshakes.
type handshake struct {
	set *handshakes
	c   net.Conn
	src netip.Addr
	el  *list.Element // nil once done or evicted
	// evicted: closed to make room for a newer connection.
	evicted atomic.Bool
}

// start registers c, from src, as shaking hands. It returns nil, and
// registers nothing, when src already has perSource handshakes under
// way. When max are under way node-wide, the oldest is evicted: removed,
// its connection closed, and reported, so the caller counts it.
func (s *handshakes) start(c net.Conn, src netip.Addr, max, perSource int) (hs *handshake, evicted bool) {
	s.mu.Lock()
	if s.bySource[src] >= perSource {
		s.mu.Unlock()
		return nil, false
	}
	var old *handshake
	if s.order.Len() >= max {
		old = s.order.Front().Value.(*handshake)
		s.removeLocked(old)
	}
	if s.bySource == nil {
		s.bySource = map[netip.Addr]int{}
	}
	s.bySource[src]++
	hs = &handshake{set: s, c: c, src: src}
	hs.el = s.order.PushBack(hs)
	s.mu.Unlock()
	if old != nil {
		old.evicted.Store(true)
		old.c.Close()
	}
	return hs, old != nil
}

func (s *handshakes) removeLocked(hs *handshake) {
	s.order.Remove(hs.el)
	hs.el = nil
	if n := s.bySource[hs.src] - 1; n > 0 {
		s.bySource[hs.src] = n
	} else {
		delete(s.bySource, hs.src)
	}
}

// done ends hs's handshake, whatever its outcome; calling it again, or
// on an evicted or nil handshake, does nothing.
func (hs *handshake) done() {
	if hs == nil {
		return
	}
	s := hs.set
	s.mu.Lock()
	if hs.el != nil {
		s.removeLocked(hs)
	}
	s.mu.Unlock()
}

// pending is how many handshakes are under way.
func (s *handshakes) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}
