package proxy

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestIdleConnectionsAreBounded is the slow-handshake attack: a peer opens
// connections to 15008 and never speaks. The pod's connection limit
// refuses those beyond it, the handshake deadline closes the rest, and
// the proxy's goroutines return to where they were.
func TestIdleConnectionsAreBounded(t *testing.T) {
	m := newMesh(t, "10.226.0.0/24", func(p *Proxy) {
		p.Limits.MaxConnectionsPerPod = 20
		p.Limits.HandshakeTimeout = 500 * time.Millisecond
	})
	goroutines := runtime.NumGoroutine()
	overLimit := m.proxy.metrics.refused.WithLabelValues(reasonPodLimit)
	timedOut := m.proxy.metrics.refused.WithLabelValues(reasonTimeout)
	before, beforeTimeout := testutil.ToFloat64(overLimit), testutil.ToFloat64(timedOut)

	const attempts = 100
	var conns []net.Conn
	for range attempts {
		c, err := m.pods[m.clientNS].Dial(context.Background(), "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Every connection ends: refused at once, or closed at the handshake
	// deadline. A read sees the close (generous bound: it is not a timing
	// assertion, only a bound on a hang).
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("connection %d: the proxy answered a client that never spoke", i)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %d is still open after 20s: no handshake deadline", i)
		}
	}
	if got := testutil.ToFloat64(overLimit) - before; got < attempts-20 {
		t.Errorf("refused over the pod's limit: %v, want at least %d", got, attempts-20)
	}
	if got := testutil.ToFloat64(timedOut) - beforeTimeout; got < 1 {
		t.Errorf("handshakes timed out: %v, want at least 1", got)
	}
	settled := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if runtime.NumGoroutine() <= goroutines+5 {
			settled = true
			break
		}
	}
	if !settled {
		t.Errorf("goroutines: %d before, %d after every connection ended", goroutines, runtime.NumGoroutine())
	}
	// The pod is still served once the attack is over.
	if got, err := m.call(t); got != "hello through the mesh" {
		t.Errorf("call after the attack = %q, %v", got, err)
	}
}

// TestOpenHBONEConnectionsHoldTheirSlots: an established HBONE connection
// counts against the pod's limit for as long as it is open, not only
// while it shakes hands.
func TestOpenHBONEConnectionsHoldTheirSlots(t *testing.T) {
	m := newMesh(t, "10.229.0.0/24", func(p *Proxy) { p.Limits.MaxConnectionsPerPod = 2 })
	overLimit := m.proxy.metrics.refused.WithLabelValues(reasonPodLimit)
	before := testutil.ToFloat64(overLimit)
	for range 2 {
		s, err := m.connect(t, net.JoinHostPort(m.pair.AddrB.String(), "8080"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	c, err := m.pods[m.clientNS].Dial(context.Background(), "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a third connection was answered")
	}
	if got := testutil.ToFloat64(overLimit) - before; got != 1 {
		t.Errorf("refused over the pod's limit: %v, want 1 (two open HBONE connections hold the slots)", got)
	}
}
