package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/node/hbone"
	"github.com/canopy-mesh/canopy/workloadapi"
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

// silentFlood is how many connections the attacks below open to 15008,
// the finding's figure.
const silentFlood = 400

// maxPendingBytes bounds what the node proxy holds, heap and stacks, per
// connection to 15008 whose peer never sends its ClientHello: its
// goroutine's stack (2 KiB, as it waits for the first byte before any
// TLS state exists), the accepted socket and its slot; the attacker's
// own end of each connection, in the same process, counts too. Before
// the handshake's writer was taken lazily, each held 261 KiB.
const maxPendingBytes = 8 << 10

// TestSilentHandshakesAreCheap is the pre-handshake flood: a pod anywhere
// in the cluster opens silentFlood connections to another pod's 15008
// and never sends a ClientHello. Each costs the proxy a few KiB and one
// goroutine until the handshake's deadline; past the per-source bound a
// connection is closed at once, with no goroutine; and a peer from
// another address is served during the flood.
func TestSilentHandshakesAreCheap(t *testing.T) {
	const perSource = 300
	m := newMesh(t, "10.238.0.0/24", func(p *Proxy) {
		// Longer than the test: the connections are measured pending.
		p.Limits.HandshakeTimeout = time.Minute
		p.Limits.MaxPendingHandshakesPerSource = perSource
	})
	legit := netip.MustParseAddr("10.238.0.4") // .1 is B, .2 is A
	addAddr(t, m.clientNS, legit, 24)
	if got, err := m.call(t); got != "hello through the mesh" {
		t.Fatalf("call before the attack = %q, %v", got, err)
	}
	m.waitIdle(t)
	refused := m.proxy.metrics.refused.WithLabelValues(reasonSourceHandshakeLimit)
	refusedBefore := testutil.ToFloat64(refused)
	time.Sleep(100 * time.Millisecond)
	base := measureProxy()

	conns := make([]net.Conn, 0, silentFlood)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range silentFlood {
		c, err := m.pods[m.clientNS].Dial(context.Background(), "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually.True(t, "every connection pending or refused", func() bool {
		return m.proxy.handshakes.pending()+int(testutil.ToFloat64(refused)-refusedBefore) == silentFlood
	})
	// The handlers park in their first read.
	time.Sleep(300 * time.Millisecond)
	flood := measureProxy()
	pending := m.proxy.handshakes.pending()
	if got := int(testutil.ToFloat64(refused) - refusedBefore); pending != perSource || got != silentFlood-perSource {
		t.Errorf("%d handshakes pending, %d refused; want %d and %d", pending, got, perSource, silentFlood-perSource)
	}
	bytes := float64(flood.heap+flood.stacks-base.heap-base.stacks) / float64(pending)
	stacks := float64(flood.stacks-base.stacks) / float64(pending)
	goroutines := flood.goroutines - base.goroutines
	t.Logf("%d silent connections, %d pending: %.0f bytes per pending connection (%.0f of them stacks), %d goroutines more",
		silentFlood, pending, bytes, stacks, goroutines)
	if bytes > maxPendingBytes && !raceEnabled {
		t.Errorf("%.0f bytes per pending handshake, want at most %d", bytes, maxPendingBytes)
	}
	// One per pending handshake; none for a refused connection.
	if goroutines > perSource+10 {
		t.Errorf("%d goroutines more for %d pending handshakes", goroutines, perSource)
	}

	// Those past the bound are already closed; the others wait for the
	// handshake's deadline, a minute away.
	var closed, open atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			} else {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if closed.Load() != silentFlood-perSource || open.Load() != perSource {
		t.Errorf("%d connections closed at once and %d waiting, want %d and %d", closed.Load(), open.Load(), silentFlood-perSource, perSource)
	}

	// Another address is served meanwhile.
	if got, err := m.echoFrom(t, legit); got != "hello from another address" {
		t.Errorf("HBONE from %s during the flood = %q, %v", legit, got, err)
	}
	for _, c := range conns {
		c.Close()
	}
	eventually.True(t, "no handshake pending once the attacker is gone", func() bool { return m.proxy.handshakes.pending() == 0 })
}

// TestPendingHandshakesNodeWide: silent connections from more addresses
// than one fill the node's pending handshakes; each new connection then
// closes the oldest instead of being refused, so a peer that speaks is
// served however many silent ones come before it.
func TestPendingHandshakesNodeWide(t *testing.T) {
	const max = 50
	m := newMesh(t, "10.239.0.0/24", func(p *Proxy) {
		p.Limits.HandshakeTimeout = time.Minute
		p.Limits.MaxPendingHandshakes = max
	})
	// .1 is B, .2 is A.
	second, legit := netip.MustParseAddr("10.239.0.3"), netip.MustParseAddr("10.239.0.4")
	addAddr(t, m.clientNS, second, 24)
	addAddr(t, m.clientNS, legit, 24)
	evicted := m.proxy.metrics.refused.WithLabelValues(reasonNodeHandshakeLimit)
	before := testutil.ToFloat64(evicted)

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range 2 * max {
		src := m.pair.AddrA
		if i%2 == 1 {
			src = second
		}
		c, err := m.pods[m.clientNS].DialFrom(context.Background(), src, "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually.True(t, "the oldest handshakes closed", func() bool { return testutil.ToFloat64(evicted)-before == max })
	if got := m.proxy.handshakes.pending(); got != max {
		t.Errorf("%d handshakes pending, want %d", got, max)
	}
	if got, err := m.echoFrom(t, legit); got != "hello from another address" {
		t.Errorf("HBONE from %s with the node's handshakes full = %q, %v", legit, got, err)
	}
	if got := testutil.ToFloat64(evicted) - before; got != max+1 {
		t.Errorf("handshakes closed for newer ones: %v, want %d", got, max+1)
	}
}

// addAddr gives the namespace at ns another address on its veth: a second
// source in the same subnet.
func addAddr(t *testing.T, ns string, a netip.Addr, bits int) {
	t.Helper()
	nettest.In(t, ns, func() (struct{}, error) {
		links, err := netlink.LinkList()
		if err != nil {
			return struct{}{}, err
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Veth); ok {
				return struct{}{}, netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}})
			}
		}
		return struct{}{}, errors.New("no veth")
	})
}

// echoFrom opens an HBONE connection from src, an address of the client
// pod, with the client's identity, and sends a message through a stream
// to the server's echo app; it returns the answer.
func (m *mesh) echoFrom(t *testing.T, src netip.Addr) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cert, err := m.proxy.Certs.Get(ctx, workloadapi.WorkloadIdentity(m.clientW))
	if err != nil {
		return "", err
	}
	raw, err := m.pods[m.clientNS].DialFrom(ctx, src, "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
	if err != nil {
		return "", err
	}
	tc, err := hbone.ClientTLS(ctx, raw, clientTLS(cert.TLS(), m.proxy.Certs.Roots(), []workloadapi.Identity{workloadapi.WorkloadIdentity(m.serverW)}))
	if err != nil {
		return "", err
	}
	cc, err := hbone.NewClientConn(tc)
	if err != nil {
		return "", err
	}
	defer cc.Close()
	s, err := cc.Connect(ctx, net.JoinHostPort(m.pair.AddrB.String(), "8080"), nil)
	if err != nil {
		return "", err
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Write([]byte("hello from another address")); err != nil {
		return "", err
	}
	_ = s.CloseWrite()
	b, err := io.ReadAll(s)
	return string(b), err
}

// footprint is what the process holds: live heap and goroutine stacks.
type footprint struct {
	heap, stacks int64
	goroutines   int
}

// measureProxy is the process's footprint after two collections (the
// second empties the sync.Pools' victim caches and shrinks the stacks
// the first left at twice their use).
func measureProxy() footprint {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return footprint{heap: int64(m.HeapAlloc), stacks: int64(m.StackInuse), goroutines: runtime.NumGoroutine()}
}
