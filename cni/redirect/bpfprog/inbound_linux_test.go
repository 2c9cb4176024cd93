package bpfprog

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// tcpFrame describes an Ethernet frame carrying a TCP segment, for the
// inbound program's test-runs. Checksums are left zero: the program does
// not read them.
type tcpFrame struct {
	src, dst   netip.AddrPort
	flags      byte
	ipv4Opts   int    // 4-byte words of IPv4 options
	ihl        int    // IPv4 IHL to write instead of the real one, if set
	fragOffset uint16 // IPv4 fragment offset, in 8-byte units
	nextHeader byte   // protocol / IPv6 next header instead of TCP, if set
}

func (f tcpFrame) bytes() []byte {
	b := make([]byte, 12, 128) // MAC addresses
	proto := byte(6)
	if f.nextHeader != 0 {
		proto = f.nextHeader
	}
	if f.dst.Addr().Is4() {
		b = binary.BigEndian.AppendUint16(b, ethPIPv4)
		ihl := 5 + f.ipv4Opts
		if f.ihl != 0 {
			ihl = f.ihl
		}
		ip := make([]byte, 20+4*f.ipv4Opts)
		ip[0] = 0x40 | byte(ihl)
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+20))
		binary.BigEndian.PutUint16(ip[6:], f.fragOffset)
		ip[8] = 64
		ip[9] = proto
		src, dst := f.src.Addr().As4(), f.dst.Addr().As4()
		copy(ip[12:], src[:])
		copy(ip[16:], dst[:])
		for i := 20; i < len(ip); i++ {
			ip[i] = 1 // NOP options
		}
		b = append(b, ip...)
	} else {
		b = binary.BigEndian.AppendUint16(b, ethPIPv6)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 20)
		ip[6] = proto
		ip[7] = 64
		src, dst := f.src.Addr().As16(), f.dst.Addr().As16()
		copy(ip[8:], src[:])
		copy(ip[24:], dst[:])
		b = append(b, ip...)
	}
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], f.src.Port())
	binary.BigEndian.PutUint16(tcp[2:], f.dst.Port())
	tcp[12] = 5 << 4
	tcp[13] = f.flags
	return append(b, tcp...)
}

const (
	syn    = tcpFlagSYN
	synAck = tcpFlagSYN | tcpFlagACK
	ack    = tcpFlagACK
)

// tcxVerdict names the program's return values, for readable diffs.
func tcxVerdict(ret uint32) string {
	switch int32(ret) {
	case tcxNext:
		return "next"
	case tcxPass:
		return "pass"
	case tcxDrop:
		return "drop"
	}
	return "unknown"
}

func runInbound(t *testing.T, prog *ebpf.Program, frame []byte) string {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("test-run: %v", err)
	}
	return tcxVerdict(ret)
}

// TestInbound test-runs the inbound program on crafted frames. The socket
// slots stay empty, so a frame the program would capture comes out as
// "drop" (fail closed), which shows it got past every check; the
// assignment itself needs real tc ingress and is left to an integration
// test. Frames cut inside their IP header cannot be run: test-run refuses
// an IPv4 or IPv6 frame shorter than its fixed IP header (EINVAL on 6.18);
// the verifier makes sure the program never reads past the end anyway.
// The runs happen inside a fresh network namespace, where the
// program's established-socket lookup finds nothing of the host's.
func TestInbound(t *testing.T) {
	coll := loadCollection(t)
	if err := PutConfig(coll.Maps[MapCfg], testConfig(t, true)); err != nil {
		t.Fatal(err)
	}
	prog := coll.Programs[ProgInbound]
	ns := newNetns(t)

	client4 := netip.MustParseAddrPort("198.51.100.7:40000")
	client6 := netip.MustParseAddrPort("[2001:db8:1::7]:40000")
	pod4 := netip.AddrPortFrom(testPod4, 8080)
	pod6 := netip.AddrPortFrom(testPod6, 8080)
	probe4 := netip.AddrPortFrom(testProbe4, 40000)
	probe6 := netip.AddrPortFrom(testProbe6, 40000)
	synTo := func(src, dst netip.AddrPort) []byte { return tcpFrame{src: src, dst: dst, flags: syn}.bytes() }

	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"SYN to the pod", synTo(client4, pod4), "drop"},
		{"SYN to the pod IPv6", synTo(client6, pod6), "drop"},
		{"SYN with IPv4 options", tcpFrame{src: client4, dst: pod4, flags: syn, ipv4Opts: 2}.bytes(), "drop"},
		{"ACK with IPv4 options", tcpFrame{src: client4, dst: pod4, flags: ack, ipv4Opts: 2}.bytes(), "next"},
		{"ACK", tcpFrame{src: client4, dst: pod4, flags: ack}.bytes(), "next"},
		{"SYN-ACK", tcpFrame{src: client4, dst: pod4, flags: synAck}.bytes(), "next"},
		{"ACK IPv6", tcpFrame{src: client6, dst: pod6, flags: ack}.bytes(), "next"},
		{"SYN to HBONE", synTo(client4, netip.AddrPortFrom(testPod4, 15008)), "next"},
		{"SYN to HBONE IPv6", synTo(client6, netip.AddrPortFrom(testPod6, 15008)), "next"},
		{"SYN from the probe source", synTo(probe4, pod4), "next"},
		{"SYN from the probe source IPv6", synTo(probe6, pod6), "next"},
		{"SYN to another address", synTo(client4, netip.MustParseAddrPort("192.0.2.11:8080")), "next"},
		{"SYN to another address IPv6", synTo(client6, netip.MustParseAddrPort("[2001:db8::11]:8080")), "next"},
		{"SYN to a link-local address", synTo(netip.MustParseAddrPort("[fe80::7]:40000"), netip.MustParseAddrPort("[fe80::10]:8080")), "drop"},
		{"SYN to the top of fe80::/10", synTo(client6, netip.MustParseAddrPort("[febf::10]:8080")), "drop"},
		{"SYN to just above fe80::/10", synTo(client6, netip.MustParseAddrPort("[fec0::10]:8080")), "next"},
		{"SYN to a link-local address from the probe source", synTo(probe6, netip.MustParseAddrPort("[fe80::10]:8080")), "next"},
		{"SYN to a link-local address on HBONE", synTo(client6, netip.MustParseAddrPort("[fe80::10]:15008")), "next"},
		{"UDP", tcpFrame{src: client4, dst: pod4, flags: syn, nextHeader: 17}.bytes(), "next"},
		{"IPv6 with a destination options header", tcpFrame{src: client6, dst: pod6, flags: syn, nextHeader: 60}.bytes(), "next"},
		{"IPv4 fragment", tcpFrame{src: client4, dst: pod4, flags: syn, fragOffset: 1}.bytes(), "next"},
		{"IHL below 5", tcpFrame{src: client4, dst: pod4, flags: syn, ihl: 4}.bytes(), "next"},
		{"IHL beyond the frame", tcpFrame{src: client4, dst: pod4, flags: syn, ihl: 15}.bytes(), "next"},
		{"truncated in the TCP header", synTo(client4, pod4)[:14+20+10], "next"},
		{"truncated in the TCP header IPv6", synTo(client6, pod6)[:14+40+10], "next"},
		{"truncated before the TCP flags", synTo(client4, pod4)[:14+20+13], "next"},
		{"Ethernet header only", append(make([]byte, 12), 0x08, 0x06), "next"},
		{"ARP", append(make([]byte, 12), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1), "next"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			if err := netns.Do(ns, func() error { got = runInbound(t, prog, tc.frame); return nil }); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

// TestInboundExistingSockets checks the program against the sockets of
// the namespace it runs in: a SYN of an established connection goes on to
// it, and a SYN for an app's listener is captured all the same.
func TestInboundExistingSockets(t *testing.T) {
	coll := loadCollection(t)
	if err := PutConfig(coll.Maps[MapCfg], testConfig(t, true)); err != nil {
		t.Fatal(err)
	}
	prog := coll.Programs[ProgInbound]
	ns := newNetns(t)
	client := netip.MustParseAddrPort("198.51.100.7:40001")
	app := netip.AddrPortFrom(testPod4, 8080)

	err := netns.Do(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{testPod4, client.Addr()} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: netipx(a)}); err != nil {
				return fmt.Errorf("add %v: %w", a, err)
			}
		}
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(context.Background(), "tcp4", app.String())
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(client)}
		d.SetMultipathTCP(false)
		c, err := d.Dial("tcp4", app.String())
		if err != nil {
			return err
		}
		t.Cleanup(func() { c.Close() })
		s, err := l.Accept()
		if err != nil {
			return err
		}
		t.Cleanup(func() { s.Close() })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"SYN of the established connection", tcpFrame{src: client, dst: app, flags: syn}.bytes(), "next"},
		{"SYN to the app's listener", tcpFrame{src: netip.MustParseAddrPort("198.51.100.7:40002"), dst: app, flags: syn}.bytes(), "drop"},
		{"SYN to a closed port", tcpFrame{src: client, dst: netip.AddrPortFrom(testPod4, 8081), flags: syn}.bytes(), "drop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			if err := netns.Do(ns, func() error { got = runInbound(t, prog, tc.frame); return nil }); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}

	// With the proxy's listener in its slot, the capture path reaches
	// bpf_sk_assign. Test-run is not tc ingress, so what the kernel says
	// there is only logged; the integration test will check delivery.
	sockets := listenProxy(t, ns, SlotInbound)
	sockets.register(t, coll.Maps[MapSocks])
	var got string
	if err := netns.Do(ns, func() error {
		got = runInbound(t, prog, tcpFrame{src: client, dst: netip.AddrPortFrom(testPod4, 8081), flags: syn}.bytes())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("SYN with the inbound slot filled, under test-run: %s", got)
}

func netipx(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}
