package proxy

import (
	"sync"
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
		DialTimeout:          10 * time.Second,
		ConnectTimeout:       10 * time.Second,
		HBONE:                hbone.DefaultLimits(),
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
