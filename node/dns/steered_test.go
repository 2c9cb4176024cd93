package dns

import (
	"net/netip"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// cmsg is one control message as the kernel writes it.
func cmsg(level, typ int, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = int32(level), int32(typ)
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func TestOrigDst(t *testing.T) {
	// sockaddr_in: family (native order), port (network order), address.
	in4 := make([]byte, unix.SizeofSockaddrInet4)
	*(*uint16)(unsafe.Pointer(&in4[0])) = unix.AF_INET
	copy(in4[2:], []byte{0, 53, 10, 96, 0, 10})
	// sockaddr_in6: family, port, flow info, address, scope.
	in6 := make([]byte, unix.SizeofSockaddrInet6)
	*(*uint16)(unsafe.Pointer(&in6[0])) = unix.AF_INET6
	copy(in6[2:], []byte{0x3b, 0x45})
	a6 := netip.MustParseAddr("fd00::10").As16()
	copy(in6[8:], a6[:])
	mapped := make([]byte, len(in6))
	copy(mapped, in6)
	m6 := netip.MustParseAddr("::ffff:192.0.2.1").As16()
	copy(mapped[8:], m6[:])

	for _, tc := range []struct {
		name string
		oob  []byte
		want netip.AddrPort
		ok   bool
	}{
		{"IPv4", cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, in4), netip.MustParseAddrPort("10.96.0.10:53"), true},
		{"IPv6", cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, in6), netip.MustParseAddrPort("[fd00::10]:15173"), true},
		{"v4-mapped IPv6 is IPv4", cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, mapped), netip.MustParseAddrPort("192.0.2.1:15173"), true},
		{"after another message", append(cmsg(unix.SOL_IP, unix.IP_TOS, []byte{0}), cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, in4)...), netip.MustParseAddrPort("10.96.0.10:53"), true},
		{"none", nil, netip.AddrPort{}, false},
		{"another message only", cmsg(unix.SOL_IP, unix.IP_TOS, []byte{0}), netip.AddrPort{}, false},
		{"cut short", cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, in4[:6]), netip.AddrPort{}, false},
		{"garbage", []byte{1, 2, 3}, netip.AddrPort{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				Dst string
				OK  bool
			}
			dst, ok := origDst(tc.oob)
			if diff := cmp.Diff(result{tc.want.String(), tc.ok}, result{dst.String(), ok}); diff != "" {
				t.Errorf("origDst (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSteeredConnOwnsDst(t *testing.T) {
	for _, tc := range []struct {
		own, dst string
		want     bool
	}{
		{"127.0.0.1:15053", "127.0.0.1:15053", true},
		{"[::1]:15053", "[::1]:15053", true},
		{"[::]:15053", "127.0.0.2:15053", true},
		{"[::]:15053", "10.96.0.10:53", false},
		{"127.0.0.1:15053", "10.96.0.10:15053", false},
		{"[::]:15053", "[fd00::10]:53", false},
	} {
		c := &steeredConn{own: netip.MustParseAddrPort(tc.own)}
		if got := c.ownsDst(netip.MustParseAddrPort(tc.dst)); got != tc.want {
			t.Errorf("socket on %s: ownsDst(%s) = %v, want %v", tc.own, tc.dst, got, tc.want)
		}
	}
}
