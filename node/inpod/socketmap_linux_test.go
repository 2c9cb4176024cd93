package inpod

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/origdst"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/bpfsteer"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// openSteered opens a proxy's sockets, DNS included, in the netns at path,
// looking for socket maps under root.
func openSteered(t *testing.T, path, root string) *Pod {
	t.Helper()
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := OpenWith(ns, Options{DNS: true, BPFRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return pod
}

// slots are the cookies in each slot of m, 0 for an empty one.
func slots(t *testing.T, m *ebpf.Map) map[sockmap.Slot]uint64 {
	t.Helper()
	got := map[sockmap.Slot]uint64{}
	for s := range sockmap.Slot(sockmap.Slots) {
		c, ok, err := sockmap.Cookie(m, s)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got[s] = c
		}
	}
	return got
}

// cookies are the cookies of the sockets a pod registers, by slot.
func cookies(t *testing.T, p *Pod) map[sockmap.Slot]uint64 {
	t.Helper()
	out := map[sockmap.Slot]uint64{}
	for s, c := range map[sockmap.Slot]any{
		sockmap.Outbound: p.Outbound, sockmap.Inbound: p.Inbound,
		sockmap.DNSTCP: p.DNSTCP[len(p.DNSTCP)-1], sockmap.DNSUDP: p.DNSUDP[len(p.DNSUDP)-1],
	} {
		cookie, err := sockmap.SocketCookie(c.(syscall.Conn))
		if err != nil {
			t.Fatal(err)
		}
		out[s] = cookie
	}
	return out
}

// TestListenFillsTheSocketMap: a proxy's Listen puts its sockets in the
// slots of the pod's map; a second proxy's (an upgrade) takes every slot
// over; a closed socket leaves its slot.
func TestListenFillsTheSocketMap(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.252.0.0/24"), netip.MustParsePrefix("fd00:252::/64"))
	m := bpfsteer.PinMap(t, root, pair.A)

	old := openSteered(t, pair.A, root)
	if !old.SocketMap {
		t.Fatal("SocketMap is false with a map pinned for the pod")
	}
	if diff := cmp.Diff(cookies(t, old), slots(t, m)); diff != "" {
		t.Errorf("slots after the first proxy's Listen (-its sockets +map):\n%s", diff)
	}
	next := openSteered(t, pair.A, root)
	if diff := cmp.Diff(cookies(t, next), slots(t, m)); diff != "" {
		t.Errorf("slots after the second proxy's Listen (-its sockets +map):\n%s", diff)
	}
	// The old proxy's sockets closing leave the new one's in place.
	want := cookies(t, next)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, slots(t, m)); diff != "" {
		t.Errorf("slots after the old proxy closed (-want +got):\n%s", diff)
	}
	if err := next.CloseListeners(); err != nil {
		t.Fatal(err)
	}
	// The TCP listeners leave at once; the detached DNS UDP socket when it
	// closes, DNSLinger later (Close here).
	if diff := cmp.Diff(map[sockmap.Slot]uint64{sockmap.DNSUDP: want[sockmap.DNSUDP]}, slots(t, m)); diff != "" {
		t.Errorf("slots after CloseListeners (-want +got):\n%s", diff)
	}
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	if got := slots(t, m); len(got) != 0 {
		t.Errorf("slots after Close: %v, want none", got)
	}
}

// TestListenWithoutASocketMap: a pod without a pinned map (redirected by
// netfilter), or a proxy told of no BPF root, registers nothing.
func TestListenWithoutASocketMap(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.252.1.0/24"))
	for _, r := range []string{root, ""} {
		if pod := openSteered(t, pair.A, r); pod.SocketMap {
			t.Errorf("root %q: SocketMap is true without a map", r)
		}
	}
}

// TestListenFailsOnABadSocketMap: a map the proxy cannot fill fails the
// pod's Listen, so that the pod is not served by sockets its traffic
// never reaches.
func TestListenFailsOnABadSocketMap(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.252.2.0/24"))
	// Two slots: an agent that knows no DNS slots.
	bpfsteer.PinSpec(t, root, pair.A, &ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := OpenWith(ns, Options{DNS: true, BPFRoot: root})
	if err == nil {
		pod.Close()
		t.Fatal("Listen succeeded with a socket map that has no DNS slots")
	}
	if !strings.Contains(err.Error(), "dns-tcp") {
		t.Errorf("error %q does not name the slot", err)
	}
}

// TestSteeredConnectionsReachTheListeners: with the pod's traffic steered
// through its socket map, the app's connection to a remote address lands
// on 15001 with that address as its local one (no NAT: SO_ORIGINAL_DST
// has nothing), and TCP DNS to any resolver completes its handshake on
// the DNS listener, for either family: both need IP_TRANSPARENT, and the
// sockets for both families.
func TestSteeredConnectionsReachTheListeners(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.252.3.0/24"), netip.MustParsePrefix("fd00:252:3::/64"))
	bpfsteer.Steer(t, root, pair.A, pair.AddrA, pair.AddrA6)
	pod := openSteered(t, pair.A, root)
	resolver4, resolver6 := netip.MustParseAddr("10.252.96.10"), netip.MustParseAddr("fd00:252:96::10")

	for _, tc := range []struct {
		name string
		to   netip.AddrPort
		l    net.Listener
	}{
		{"outbound IPv4 lands on 15001", netip.AddrPortFrom(pair.AddrB, 80), pod.Outbound},
		{"outbound IPv6 lands on 15001", netip.AddrPortFrom(pair.AddrB6, 80), pod.Outbound},
		{"outbound to an address nobody has lands on 15001", netip.AddrPortFrom(netip.MustParseAddr("10.252.200.1"), 443), pod.Outbound},
		{"IPv4 DNS over TCP lands on 15053", netip.AddrPortFrom(resolver4, 53), pod.DNSTCP[len(pod.DNSTCP)-1]},
		{"IPv6 DNS over TCP lands on 15053", netip.AddrPortFrom(resolver6, 53), pod.DNSTCP[len(pod.DNSTCP)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dialed := make(chan error, 1)
			go func() {
				dialed <- netns.Do(pair.A, func() error {
					c, err := net.DialTimeout("tcp", tc.to.String(), 3*time.Second)
					if err == nil {
						c.Close()
					}
					return err
				})
			}()
			c := accept(t, tc.l)
			if err := <-dialed; err != nil {
				t.Fatalf("the app's connection: %v", err)
			}
			if got := c.LocalAddr().(*net.TCPAddr).AddrPort(); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != tc.to {
				t.Errorf("local address %v, want the app's destination %v", got, tc.to)
			}
			if _, err := origdst.Of(c); !errors.Is(err, syscall.ENOENT) {
				t.Errorf("SO_ORIGINAL_DST: %v, want ENOENT (nothing NATed)", err)
			}
		})
	}
}

// TestSteeredHandOverLosesNothing is an upgrade of a pod redirected by
// eBPF: the new proxy's Listen takes the slots over while the old proxy
// still serves, queries and connections queue on both (the slot's socket
// shares its SO_REUSEPORT group with the old one's), and the old proxy
// closes its listeners. Every query is answered, those that came later by
// the new proxy only, and every queued connection is served (with
// tcp_migrate_req, as the agent sets it).
func TestSteeredHandOverLosesNothing(t *testing.T) {
	nettest.NeedRoot(t)
	if _, err := os.Stat(migrateSysctl); err != nil {
		ci.Unavailable(t, "the kernel has no net.ipv4.tcp_migrate_req (Linux 5.14)")
	}
	root := nettest.BPFFS(t)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.252.4.0/24"))
	bpfsteer.Steer(t, root, pair.A, pair.AddrA)
	nettest.In(t, pair.A, func() (struct{}, error) { return struct{}{}, os.WriteFile(migrateSysctl, []byte("1"), 0o644) })
	old := openSteered(t, pair.A, root)
	next := openSteered(t, pair.A, root)
	resolver := "10.252.96.10:53"

	// Nobody reads or accepts yet: it all queues. Each query from a
	// socket of its own (a resolver's new source port), unconnected: the
	// test's answers come from the proxy's socket, not from the server.
	const n = 32
	type client struct {
		pc   net.PacketConn
		what string
	}
	ask := func(what string) []client {
		var cs []client
		for i := range n {
			pc := nettest.In(t, pair.A, func() (net.PacketConn, error) { return net.ListenPacket("udp4", pair.AddrA.String()+":0") })
			t.Cleanup(func() { pc.Close() })
			msg := fmt.Sprintf("%s-%d", what, i)
			if _, err := pc.WriteTo([]byte(msg), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(resolver))); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, client{pc, msg})
		}
		return cs
	}
	var conns []net.Conn
	for range n {
		c := nettest.In(t, pair.A, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrB.String()+":80", 3*time.Second) })
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
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
	go answer(old.DNSUDP[len(old.DNSUDP)-1], "old")
	go answer(next.DNSUDP[len(next.DNSUDP)-1], "new")
	go func() {
		for {
			c, err := next.Outbound.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
	}()

	var fromOld int
	for _, c := range append(before, after...) {
		buf := make([]byte, 64)
		_ = c.pc.SetReadDeadline(time.Now().Add(3 * time.Second))
		m, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("query %s got no answer: %v", c.what, err)
		}
		got := string(buf[:m])
		if strings.HasPrefix(got, "old:") {
			fromOld++
			if strings.Contains(got, "after") {
				t.Errorf("a query sent after the old proxy detached reached it: %q", got)
			}
		}
	}
	t.Logf("%d of %d queries queued on the old proxy's socket, all answered", fromOld, n)
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Errorf("queued connection %d: %v", i, err)
		}
	}
}

// TestTransparentOnlyWhereNeeded: IP_TRANSPARENT is on the sockets that
// accept connections to addresses the pod does not own (a steered pod's
// 15001 and DNS TCP listener), and on no other.
func TestTransparentOnlyWhereNeeded(t *testing.T) {
	nettest.NeedRoot(t)
	root := nettest.BPFFS(t)
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.252.5.0/24"), netip.MustParsePrefix("fd00:252:5::/64"))
	bpfsteer.PinMap(t, root, pair.A)
	transparent := func(l net.Listener) bool {
		t.Helper()
		raw, err := l.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var serr error
		if err := raw.Control(func(fd uintptr) {
			if l.Addr().(*net.TCPAddr).IP.To4() != nil {
				v, serr = unix.GetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT)
			} else {
				v, serr = unix.GetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT)
			}
		}); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return v == 1
	}
	listeners := func(p *Pod) map[string]bool {
		out := map[string]bool{"15001": transparent(p.Outbound), "15006": transparent(p.Inbound), "15008": transparent(p.HBONE)}
		for _, l := range p.DNSTCP {
			out["dns "+l.Addr().String()] = transparent(l)
		}
		return out
	}
	steered := openSteered(t, pair.A, root)
	if diff := cmp.Diff(map[string]bool{"15001": true, "15006": false, "15008": false,
		"dns 127.0.0.1:15053": false, "dns [::1]:15053": false, "dns [::]:15053": true}, listeners(steered)); diff != "" {
		t.Errorf("IP_TRANSPARENT of a steered pod's listeners (-want +got):\n%s", diff)
	}
	plain := openSteered(t, pair.B, root)
	if diff := cmp.Diff(map[string]bool{"15001": false, "15006": false, "15008": false,
		"dns 127.0.0.1:15053": false, "dns [::1]:15053": false}, listeners(plain)); diff != "" {
		t.Errorf("IP_TRANSPARENT of a netfilter pod's listeners (-want +got):\n%s", diff)
	}
}
