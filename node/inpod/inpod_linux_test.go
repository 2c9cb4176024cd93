package inpod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/origdst"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

func accept(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := l.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() { r.c.Close() })
		return r.c
	case <-time.After(5 * time.Second):
		t.Fatal("nothing accepted")
	}
	return nil
}

// TestListenersInAnEnrolledPod: the agent's rules send traffic to the
// sockets this package opens, and the proxy's own traffic passes.
func TestListenersInAnEnrolledPod(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.220.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	outside := nettest.Listen(t, pair.B, pair.AddrB.String()+":9000")

	t.Run("outbound from the app lands on 15001", func(t *testing.T) {
		go nettest.In(t, pair.A, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrB.String()+":80", 3*time.Second) })
		c := accept(t, pod.Outbound)
		if dst, err := origdst.Of(c); err != nil || dst.String() != pair.AddrB.String()+":80" {
			t.Errorf("original destination %v, %v", dst, err)
		}
	})
	t.Run("the proxy's own dial passes", func(t *testing.T) {
		c, err := pod.Dial(context.Background(), "tcp4", pair.AddrB.String()+":9000")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case got := <-outside:
			got.Close()
		case <-time.After(5 * time.Second):
			t.Fatal("the marked dial was captured")
		}
	})
	t.Run("inbound plaintext lands on 15006", func(t *testing.T) {
		go nettest.In(t, pair.B, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrA.String()+":8080", 3*time.Second) })
		c := accept(t, pod.Inbound)
		if dst, err := origdst.Of(c); err != nil || dst.String() != pair.AddrA.String()+":8080" {
			t.Errorf("original destination %v, %v", dst, err)
		}
	})
	t.Run("HBONE reaches 15008", func(t *testing.T) {
		go nettest.In(t, pair.B, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrA.String()+":15008", 3*time.Second) })
		accept(t, pod.HBONE)
	})
}

// TestListenersTakeIPv6: in a dual-stack pod the same three sockets take
// the IPv6 the rules redirect, with its original destination, and the
// proxy reaches the app from a client's IPv6 address with the replies
// routed back to it (ip -6 rule fwmark 0x111, table 100).
func TestListenersTakeIPv6(t *testing.T) {
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.221.0.0/24"), netip.MustParsePrefix("fd00:221::/64"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	outside6 := netip.AddrPortFrom(pair.AddrB6, 9000).String()
	outside := nettest.Listen(t, pair.B, outside6)

	for _, tc := range []struct {
		name     string
		from     string
		to       netip.AddrPort
		listener net.Listener
	}{
		{"outbound IPv6 from the app lands on 15001", pair.A, netip.AddrPortFrom(pair.AddrB6, 80), pod.Outbound},
		{"outbound IPv4 from the app lands on 15001", pair.A, netip.AddrPortFrom(pair.AddrB, 80), pod.Outbound},
		{"inbound IPv6 plaintext lands on 15006", pair.B, netip.AddrPortFrom(pair.AddrA6, 8080), pod.Inbound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			go nettest.In(t, tc.from, func() (net.Conn, error) { return net.DialTimeout("tcp", tc.to.String(), 3*time.Second) })
			c := accept(t, tc.listener)
			if dst, err := origdst.Of(c); err != nil || dst != tc.to {
				t.Errorf("original destination %v, %v; want %v", dst, err, tc.to)
			}
		})
	}
	t.Run("IPv6 HBONE reaches 15008", func(t *testing.T) {
		go nettest.In(t, pair.B, func() (net.Conn, error) {
			return net.DialTimeout("tcp", netip.AddrPortFrom(pair.AddrA6, 15008).String(), 3*time.Second)
		})
		accept(t, pod.HBONE)
	})
	t.Run("the proxy's own IPv6 dial passes", func(t *testing.T) {
		c, err := pod.Dial(context.Background(), "tcp", outside6)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case got := <-outside:
			got.Close()
		case <-time.After(5 * time.Second):
			t.Fatal("the marked dial was captured")
		}
	})
	for _, tc := range []struct {
		name      string
		src, self netip.Addr
	}{
		{"DialFrom an IPv6 client reaches the app and hears back", pair.AddrB6, pair.AddrA6},
		{"DialFrom an IPv4 client reaches the app and hears back", pair.AddrB, pair.AddrA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := nettest.Listen(t, pair.A, netip.AddrPortFrom(tc.self, 8081).String())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := pod.DialFrom(ctx, tc.src, "tcp", netip.AddrPortFrom(tc.self, 8081).String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var got net.Conn
			select {
			case got = <-app:
				defer got.Close()
			case <-time.After(5 * time.Second):
				t.Fatal("the app accepted nothing")
			}
			if from := got.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(); from != tc.src {
				t.Errorf("the app sees %v, want the client %v", from, tc.src)
			}
			// The reply goes to a foreign address: only table 100 brings it
			// back to the proxy's socket.
			if _, err := got.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 4)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
				t.Fatalf("the proxy read %q, %v", buf, err)
			}
		})
	}
}

// TestClosingListenersHandsQueuedConnectionsOver is the kernel half of a
// node proxy upgrade: an old and a new proxy's sockets share the pod's
// ports (SO_REUSEPORT), connections wait in both accept queues, and the
// old proxy closes its listeners. With net.ipv4.tcp_migrate_req on (the
// CNI agent's setting) every queued connection is served by the new
// proxy; off, those queued on the old proxy are reset, which is what the
// setting is for.
func TestClosingListenersHandsQueuedConnectionsOver(t *testing.T) {
	for _, tt := range []struct {
		name    string
		subnet  string
		migrate string
		// wantReset: whether some connections must be reset.
		wantReset bool
	}{
		{"tcp_migrate_req on: every queued connection is served", "10.230.0.0/24", "1", false},
		{"tcp_migrate_req off: the old proxy's queue is reset", "10.231.0.0/24", "0", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pair := nettest.NewPair(t, netip.MustParsePrefix(tt.subnet))
			if _, err := os.Stat(migrateSysctl); err != nil {
				ci.Unavailable(t, "the kernel has no net.ipv4.tcp_migrate_req (Linux 5.14)")
			}
			nettest.In(t, pair.A, func() (struct{}, error) {
				return struct{}{}, os.WriteFile(migrateSysctl, []byte(tt.migrate), 0o644)
			})
			old, next := openPod(t, pair.A), openPod(t, pair.A)
			if got, err := old.MigratesRequests(); err != nil || got != (tt.migrate == "1") {
				t.Fatalf("MigratesRequests() = %v, %v; want %v", got, err, tt.migrate == "1")
			}
			// Nobody accepts yet: every connection waits in the queue of
			// the socket the kernel picked for it, old or new.
			const n = 64
			clients := make([]net.Conn, 0, n)
			for range n {
				c := nettest.In(t, pair.B, func() (net.Conn, error) {
					return net.DialTimeout("tcp4", pair.AddrA.String()+":15008", 3*time.Second)
				})
				t.Cleanup(func() { c.Close() })
				clients = append(clients, c)
			}
			if err := old.CloseListeners(); err != nil {
				t.Fatal(err)
			}
			// The new proxy answers each connection it gets with a byte.
			go func() {
				for {
					c, err := next.HBONE.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte("x"))
					c.Close() // nothing unread: a FIN after the byte, no reset
				}
			}()
			served, reset := 0, 0
			for i, c := range clients {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c.Read(make([]byte, 1))
				switch {
				case err == nil:
					served++
				case errors.Is(err, syscall.ECONNRESET):
					reset++
				default:
					t.Errorf("connection %d: %v", i, err)
				}
			}
			t.Logf("%d queued connections: %d served by the new listener, %d reset", n, served, reset)
			if tt.wantReset != (reset > 0) || served+reset != n {
				t.Errorf("served %d, reset %d of %d; want resets: %v", served, reset, n, tt.wantReset)
			}
		})
	}
}

// openPod opens the proxy's listeners in the netns at path, as one proxy
// does; two calls are two proxies sharing the ports.
func openPod(t *testing.T, path string) *Pod {
	t.Helper()
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return pod
}

// TestDialAfterClose: a closed pod refuses dials instead of entering
// whatever namespace its descriptor number names by then.
func TestDialAfterClose(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.232.0.0/24"))
	pod := openPod(t, pair.A)
	if err := pod.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	outside := nettest.Listen(t, pair.B, pair.AddrB.String()+":9000")
	c, err := pod.Dial(context.Background(), "tcp4", pair.AddrB.String()+":9000")
	if err != nil {
		t.Fatalf("dial with the listeners closed: %v", err)
	}
	c.Close()
	(<-outside).Close()
	for range 2 {
		if err := pod.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pod.Dial(context.Background(), "tcp4", pair.AddrB.String()+":9000"); !errors.Is(err, ErrClosed) {
		t.Errorf("dial after Close = %v, want ErrClosed", err)
	}
	if _, err := pod.MigratesRequests(); !errors.Is(err, ErrClosed) {
		t.Errorf("MigratesRequests after Close = %v, want ErrClosed", err)
	}
}

// TestDNSSocketsTakeCapturedQueries: with DNS capture in the pod, a query
// the app sends to any resolver (UDP or TCP port 53) lands on the
// proxy's 15053 on the pod's loopback, and the proxy's own marked query
// leaves for the resolver it names.
func TestDNSSocketsTakeCapturedQueries(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.221.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := OpenWith(ns, Options{DNS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	if len(pod.DNSUDP) == 0 || len(pod.DNSTCP) != len(pod.DNSUDP) {
		t.Fatalf("DNS sockets: %d UDP, %d TCP", len(pod.DNSUDP), len(pod.DNSTCP))
	}
	if got := pod.DNSUDP[0].LocalAddr().String(); got != "127.0.0.1:15053" {
		t.Errorf("first UDP socket on %s, want 127.0.0.1:15053", got)
	}
	resolver := pair.AddrB.String() + ":53"

	t.Run("UDP from the app", func(t *testing.T) {
		c := nettest.In(t, pair.A, func() (net.Conn, error) { return net.Dial("udp4", resolver) })
		defer c.Close()
		if _, err := c.Write([]byte("query")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		_ = pod.DNSUDP[0].SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := pod.DNSUDP[0].ReadFrom(buf)
		if err != nil || string(buf[:n]) != "query" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		// The answer goes back through the same redirection: the app
		// sees it from the resolver it asked.
		if _, err := pod.DNSUDP[0].WriteTo([]byte("answer"), from); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err = c.Read(buf)
		if err != nil || string(buf[:n]) != "answer" {
			t.Fatalf("the app read %q, %v", buf[:n], err)
		}
	})
	t.Run("TCP from the app", func(t *testing.T) {
		go nettest.In(t, pair.A, func() (net.Conn, error) { return net.DialTimeout("tcp4", resolver, 3*time.Second) })
		accept(t, pod.DNSTCP[0])
	})
	t.Run("the proxy's own query passes", func(t *testing.T) {
		upstream := nettest.In(t, pair.B, func() (net.PacketConn, error) { return net.ListenPacket("udp4", resolver) })
		defer upstream.Close()
		c, err := pod.Dial(context.Background(), "udp4", resolver)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("forwarded")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		_ = upstream.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _, err := upstream.ReadFrom(buf); err != nil || string(buf[:n]) != "forwarded" {
			t.Fatalf("the resolver read %q, %v: the marked query was captured", buf[:n], err)
		}
	})
	if err := pod.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	// Detached, with no other proxy's socket beside it: a new query is
	// refused at once rather than left to time out.
	c := nettest.In(t, pair.A, func() (net.Conn, error) { return net.Dial("udp4", resolver) })
	defer c.Close()
	if _, err := c.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 64)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a query after CloseListeners: %v, want connection refused", err)
	}
	if err := pod.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pod.DNSUDP[0].ReadFrom(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("UDP socket after Close: %v", err)
	}
}

// TestDNSHandOverLosesNoQuery: during an upgrade the old proxy closes its
// DNS sockets while queries wait in them, and more keep coming. Every
// query is answered: those queued on the old socket by the old proxy
// (closing it would drop them, each a client's 5 s timeout), the later
// ones by the new proxy.
func TestDNSHandOverLosesNoQuery(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.233.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	openDNS := func() *Pod {
		ns, err := os.Open(pair.A)
		if err != nil {
			t.Fatal(err)
		}
		p, err := OpenWith(ns, Options{DNS: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	old, next := openDNS(), openDNS()
	resolver := pair.AddrB.String() + ":53"
	// Each query from a socket of its own (a resolver's new source port),
	// so the kernel spreads them over both proxies' sockets. Nobody reads
	// yet: they queue.
	const n = 48
	ask := func(what string) []net.Conn {
		var cs []net.Conn
		for i := range n {
			c := nettest.In(t, pair.A, func() (net.Conn, error) { return net.Dial("udp4", resolver) })
			t.Cleanup(func() { c.Close() })
			if _, err := fmt.Fprintf(c, "%s-%d", what, i); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		return cs
	}
	before := ask("before")
	if err := old.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	after := ask("after")
	answer := func(pc net.PacketConn, who string) {
		buf := make([]byte, 64)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(who+":"+string(buf[:m])), from)
		}
	}
	go answer(old.DNSUDP[0], "old")
	go answer(next.DNSUDP[0], "new")
	var fromOld int
	for i, c := range append(before, after...) {
		buf := make([]byte, 64)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("query %d got no answer: %v", i, err)
		}
		got := string(buf[:m])
		if strings.HasPrefix(got, "old:") {
			fromOld++
			if strings.Contains(got, "after") {
				t.Errorf("a query sent after the old proxy detached reached it: %q", got)
			}
		}
	}
	if fromOld == 0 {
		t.Errorf("no query was queued on the old socket: the test proves nothing")
	}
	t.Logf("%d of %d queries queued on the old proxy's socket, all answered", fromOld, n)
}

// TestAnotherProxyListens: a new node proxy handed a pod asks whether the
// old one still listens in it. Its listener answers yes; the connections
// it accepted, once its listeners closed, do not.
func TestAnotherProxyListens(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.232.0.0/24"))
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	next := Attach(ns)
	defer next.Close()
	probe := func() bool {
		t.Helper()
		held, err := next.AnotherProxyListens()
		if err != nil {
			t.Fatal(err)
		}
		return held
	}
	if probe() {
		t.Fatal("an empty namespace: another proxy listens")
	}
	old := openPod(t, pair.A)
	if !probe() {
		t.Fatal("the old proxy's listeners are open: nobody listens")
	}
	// A connection the old proxy accepted outlives its listeners.
	client := nettest.In(t, pair.B, func() (net.Conn, error) {
		return net.DialTimeout("tcp4", pair.AddrA.String()+":15001", 3*time.Second)
	})
	defer client.Close()
	accept(t, old.Outbound)
	if err := old.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	if probe() {
		t.Fatal("the old proxy closed its listeners (one connection left open): another proxy listens")
	}
	if err := next.Listen(Options{}); err != nil {
		t.Fatal(err)
	}
	c := nettest.In(t, pair.B, func() (net.Conn, error) {
		return net.DialTimeout("tcp4", pair.AddrA.String()+":15001", 3*time.Second)
	})
	defer c.Close()
	accept(t, next.Outbound)
}

// TestDialUDPFromThePod: UDP dials leave from the pod's namespace (its
// address, the proxy's mark) on a new source port each, though their
// sockets were made ahead in batches; a closed pod dials no more.
func TestDialUDPFromThePod(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.236.0.0/24"))
	pod := openPod(t, pair.A)
	resolver := pair.AddrB.String() + ":53"
	upstream := nettest.In(t, pair.B, func() (net.PacketConn, error) { return net.ListenPacket("udp4", resolver) })
	defer upstream.Close()
	ports := map[string]bool{}
	for i := range 3 * udpBatch {
		c, err := pod.Dial(context.Background(), "udp", resolver)
		if err != nil {
			t.Fatal(err)
		}
		// Open until the end: the kernel may give a closed socket's
		// port to a later one (24 draws from its range met about once
		// in a hundred runs), which is no reuse of a socket.
		defer c.Close()
		if _, err := fmt.Fprintf(c, "q%d", i); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16)
		_ = upstream.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, from, err := upstream.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if got := from.(*net.UDPAddr).IP.String(); got != pair.AddrA.String() {
			t.Errorf("query %d from %s, want the pod's %s", i, got, pair.AddrA)
		}
		ports[from.String()] = true
	}
	if len(ports) != 3*udpBatch {
		t.Errorf("%d dials left from %d source ports, want one each", 3*udpBatch, len(ports))
	}
	pod.Close()
	if _, err := pod.Dial(context.Background(), "udp", resolver); !errors.Is(err, ErrClosed) {
		t.Errorf("a dial after Close: %v, want ErrClosed", err)
	}
}

// TestListenersArePlainTCP: the in-pod listeners are TCP sockets, not
// MPTCP ones (Go's default for listeners), which a socket map refuses.
func TestListenersArePlainTCP(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.237.0.0/24"))
	pod := openPod(t, pair.A)
	for _, l := range []net.Listener{pod.Outbound, pod.Inbound, pod.HBONE} {
		raw, err := l.(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var proto int
		var serr error
		if err := raw.Control(func(fd uintptr) { proto, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		if proto != unix.IPPROTO_TCP {
			t.Errorf("listener %s: protocol %d, want TCP (%d)", l.Addr(), proto, unix.IPPROTO_TCP)
		}
	}
}
