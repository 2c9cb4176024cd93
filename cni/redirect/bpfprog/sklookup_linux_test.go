package bpfprog

import (
	"net/netip"
	"testing"

	"syscall"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// skLookupCtx is struct bpf_sk_lookup as PROG_TEST_RUN takes it: only the
// fields up to local_port may be set, and the socket/cookie must be zero
// on the way in. On the way out Cookie is the assigned socket's cookie.
type skLookupCtx struct {
	Cookie         uint64
	Family         uint32
	Protocol       uint32
	RemoteIP4      [4]byte
	RemoteIP6      [16]byte
	RemotePort     [2]byte // network byte order
	_              [2]byte
	LocalIP4       [4]byte
	LocalIP6       [16]byte
	LocalPort      uint32 // host byte order
	IngressIfindex uint32
	_              [4]byte
}

// newSkLookupCtx is a lookup for a packet from remote to local.
func newSkLookupCtx(proto uint32, remote, local netip.AddrPort) skLookupCtx {
	c := skLookupCtx{Protocol: proto, LocalPort: uint32(local.Port())}
	c.RemotePort = [2]byte{byte(remote.Port() >> 8), byte(remote.Port())}
	if local.Addr().Is4() {
		c.Family = unix.AF_INET
		c.RemoteIP4, c.LocalIP4 = remote.Addr().As4(), local.Addr().As4()
	} else {
		c.Family = unix.AF_INET6
		c.RemoteIP6, c.LocalIP6 = remote.Addr().As16(), local.Addr().As16()
	}
	return c
}

type skLookupResult struct {
	Verdict uint32
	Slot    int // -1: no socket assigned
}

func runSkLookup(t *testing.T, prog *ebpf.Program, ctx skLookupCtx, sockets *proxySockets) skLookupResult {
	t.Helper()
	var out skLookupCtx
	ret, err := prog.Run(&ebpf.RunOptions{Context: ctx, ContextOut: &out})
	if err != nil {
		t.Fatalf("test-run: %v", err)
	}
	r := skLookupResult{Verdict: ret, Slot: -1}
	if out.Cookie == 0 {
		return r
	}
	for slot, cookie := range sockets.cookies {
		if cookie == out.Cookie {
			r.Slot = slot
			return r
		}
	}
	t.Fatalf("assigned socket cookie %d is none of the proxy's %v", out.Cookie, sockets.cookies)
	return r
}

func TestSkLookup(t *testing.T) {
	coll := loadCollection(t)
	sockets := listenProxy(t, newNetns(t), SlotOutbound, SlotInbound, SlotDNSTCP, SlotDNSUDP)
	sockets.register(t, coll.Maps[MapSocks])
	prog := coll.Programs[ProgSkLookup]

	app4 := netip.AddrPortFrom(testPod4, 40000)
	app6 := netip.AddrPortFrom(testPod6, 40000)
	remote4 := netip.MustParseAddrPort("198.51.100.7:80")
	remote6 := netip.MustParseAddrPort("[2001:db8:1::7]:443")
	dns4 := netip.MustParseAddrPort("198.51.100.53:53")
	dns6 := netip.MustParseAddrPort("[2001:db8:1::53]:53")
	pass := skLookupResult{Verdict: skPass, Slot: -1}
	to := func(slot int) skLookupResult { return skLookupResult{Verdict: skPass, Slot: slot} }

	for _, tc := range []struct {
		name string
		dns  bool
		ctx  skLookupCtx
		want skLookupResult
	}{
		{"outbound TCP", true, newSkLookupCtx(unix.IPPROTO_TCP, app4, remote4), to(SlotOutbound)},
		{"outbound TCP IPv6", true, newSkLookupCtx(unix.IPPROTO_TCP, app6, remote6), to(SlotOutbound)},
		{"DNS over TCP", true, newSkLookupCtx(unix.IPPROTO_TCP, app4, dns4), to(SlotDNSTCP)},
		{"DNS over TCP IPv6", true, newSkLookupCtx(unix.IPPROTO_TCP, app6, dns6), to(SlotDNSTCP)},
		{"TCP to 53 without DNS capture is outbound", false, newSkLookupCtx(unix.IPPROTO_TCP, app4, dns4), to(SlotOutbound)},
		{"DNS over UDP", true, newSkLookupCtx(unix.IPPROTO_UDP, app4, dns4), to(SlotDNSUDP)},
		{"DNS over UDP IPv6", true, newSkLookupCtx(unix.IPPROTO_UDP, app6, dns6), to(SlotDNSUDP)},
		{"UDP to 53 without DNS capture", false, newSkLookupCtx(unix.IPPROTO_UDP, app4, dns4), pass},
		{"UDP to another port", true, newSkLookupCtx(unix.IPPROTO_UDP, app4, netip.MustParseAddrPort("198.51.100.7:123")), pass},
		{"to the pod IP", true, newSkLookupCtx(unix.IPPROTO_TCP, remote4, netip.AddrPortFrom(testPod4, 8080)), pass},
		{"to the pod IPv6", true, newSkLookupCtx(unix.IPPROTO_TCP, remote6, netip.AddrPortFrom(testPod6, 8080)), pass},
		{"DNS to the pod IP", true, newSkLookupCtx(unix.IPPROTO_UDP, remote4, netip.AddrPortFrom(testPod4, 53)), pass},
		{"to 127.0.0.1", true, newSkLookupCtx(unix.IPPROTO_TCP, app4, netip.MustParseAddrPort("127.0.0.1:8080")), pass},
		{"to 127.1.2.3", true, newSkLookupCtx(unix.IPPROTO_TCP, app4, netip.MustParseAddrPort("127.1.2.3:8080")), pass},
		{"DNS to 127.0.0.53", true, newSkLookupCtx(unix.IPPROTO_UDP, app4, netip.MustParseAddrPort("127.0.0.53:53")), pass},
		{"to ::1", true, newSkLookupCtx(unix.IPPROTO_TCP, app6, netip.MustParseAddrPort("[::1]:8080")), pass},
		{"to ::2 is outbound", true, newSkLookupCtx(unix.IPPROTO_TCP, app6, netip.MustParseAddrPort("[::2]:8080")), to(SlotOutbound)},
		{"to an address sharing the pod IPv6's first words", true, newSkLookupCtx(unix.IPPROTO_TCP, app6, netip.MustParseAddrPort("[2001:db8::11]:80")), to(SlotOutbound)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := PutConfig(coll.Maps[MapCfg], testConfig(t, tc.dns)); err != nil {
				t.Fatal(err)
			}
			got := runSkLookup(t, prog, tc.ctx, sockets)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSkLookupFailsClosed checks that captured traffic is dropped, not let
// through, when the proxy has not registered the socket it belongs to or
// the kernel refuses it.
func TestSkLookupFailsClosed(t *testing.T) {
	drop := skLookupResult{Verdict: skDrop, Slot: -1}
	app4 := netip.AddrPortFrom(testPod4, 40000)
	remote4 := netip.MustParseAddrPort("198.51.100.7:80")
	dns4 := netip.MustParseAddrPort("198.51.100.53:53")

	t.Run("empty slots", func(t *testing.T) {
		coll := loadCollection(t)
		if err := PutConfig(coll.Maps[MapCfg], testConfig(t, true)); err != nil {
			t.Fatal(err)
		}
		// Only the inbound slot is filled, which sk_lookup never uses.
		sockets := listenProxy(t, newNetns(t), SlotInbound)
		sockets.register(t, coll.Maps[MapSocks])
		for _, ctx := range []skLookupCtx{
			newSkLookupCtx(unix.IPPROTO_TCP, app4, remote4),
			newSkLookupCtx(unix.IPPROTO_TCP, app4, dns4),
			newSkLookupCtx(unix.IPPROTO_UDP, app4, dns4),
		} {
			if diff := cmp.Diff(drop, runSkLookup(t, coll.Programs[ProgSkLookup], ctx, sockets)); diff != "" {
				t.Errorf("protocol %d to port %d (-want +got):\n%s", ctx.Protocol, ctx.LocalPort, diff)
			}
		}
	})

	t.Run("socket of the wrong protocol", func(t *testing.T) {
		coll := loadCollection(t)
		if err := PutConfig(coll.Maps[MapCfg], testConfig(t, true)); err != nil {
			t.Fatal(err)
		}
		// A UDP socket in the outbound slot: bpf_sk_assign refuses it
		// for a TCP lookup.
		sockets := listenProxy(t, newNetns(t), SlotDNSUDP)
		udp := &proxySockets{conns: map[int]syscall.Conn{SlotOutbound: sockets.conns[SlotDNSUDP]}}
		udp.register(t, coll.Maps[MapSocks])
		if diff := cmp.Diff(drop, runSkLookup(t, coll.Programs[ProgSkLookup], newSkLookupCtx(unix.IPPROTO_TCP, app4, remote4), sockets)); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
}
