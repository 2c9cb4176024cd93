// Package origdst reads where a connection redirected by netfilter
// (REDIRECT to the node proxy's listeners) was originally going.
package origdst

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Of returns where a redirected connection was going
// (SO_ORIGINAL_DST; IPv4).
func Of(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%T is not TCP", c)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var got netip.AddrPort
	var serr error
	if err := raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		// A sockaddr_in: family, port (big endian), address.
		port := uint16(m.Multiaddr[2])<<8 | uint16(m.Multiaddr[3])
		got = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	return got, nil
}
