// Package origdst reads where a connection captured for the node proxy was
// originally going, for IPv4 and IPv6 connections alike: the conntrack
// entry of one redirected by netfilter (REDIRECT to the proxy's
// listeners), or the local address of one handed to the listener unNATed
// (the CNI agent's eBPF redirection, a TPROXY).
package origdst

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ErrOwnListener is a connection made to one of the proxy's own listeners
// rather than redirected to it: it has no destination but the proxy.
var ErrOwnListener = errors.New("connection to the proxy's own listener, not redirected to it")

// Destination returns where a captured connection was going: its
// original destination where netfilter NATed it (Of), else its local
// address, as a connection the redirection handed over unNATed keeps the
// destination the client asked for. own reports whether a local address
// is one of the proxy's own listeners (its ports on the pod's addresses
// or loopback): a connection whose local address is one was not
// redirected but made to the listener itself, and is refused with
// ErrOwnListener, as the proxy would otherwise connect to itself.
func Destination(c net.Conn, own func(netip.AddrPort) bool) (netip.AddrPort, error) {
	orig, err := Of(c)
	var local netip.AddrPort
	if tc, ok := c.LocalAddr().(*net.TCPAddr); ok {
		local = tc.AddrPort()
	}
	return Decide(orig, err, local, own)
}

// Decide is Destination's choice, from what Of returned (orig, err) and
// the connection's local address.
//
// Only "no entry" falls back to the local address: ENOENT, conntrack has
// no entry for the connection (nothing NATed it; the eBPF redirection
// involves no conntrack), or ENOPROTOOPT, the kernel has no conntrack at
// all (nothing can have NATed it). Any other error is the connection's.
func Decide(orig netip.AddrPort, err error, local netip.AddrPort, own func(netip.AddrPort) bool) (netip.AddrPort, error) {
	if err == nil {
		return orig, nil
	}
	if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOPROTOOPT) {
		return netip.AddrPort{}, err
	}
	if !local.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("no original destination (%w) and no local address", err)
	}
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	if own(local) {
		return netip.AddrPort{}, fmt.Errorf("%w: %s", ErrOwnListener, local)
	}
	return local, nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// which x/sys/unix does not name: the IPv6 twin of SO_ORIGINAL_DST, asked at
// SOL_IPV6. Both are 80.
const ip6tSOOriginalDst = 80

// Of returns where a redirected connection was going. The family of the
// connection, not of the listening socket, picks the question: the node
// proxy's listeners are dual-stack, so an IPv4 connection arrives with
// v4-mapped addresses and still has only an IPv4 conntrack entry.
//
// Only REDIRECT (a NAT) leaves an original destination behind; a
// connection handed over unNATed has none (ENOENT) and its destination in
// its local address: see Destination.
func Of(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%T is not TCP", c)
	}
	local, ok := tc.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("local address %v is not TCP", tc.LocalAddr())
	}
	v4 := local.IP.To4() != nil
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var got netip.AddrPort
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if v4 {
			got, serr = of4(int(fd))
		} else {
			got, serr = of6(int(fd))
		}
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return got, serr
}

// of4 asks SO_ORIGINAL_DST, which answers a sockaddr_in (16 bytes); the
// 20-byte ipv6_mreq is only the buffer that holds it.
func of4(fd int) (netip.AddrPort, error) {
	m, err := unix.GetsockoptIPv6Mreq(fd, unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	// A sockaddr_in: family, port (big endian), address.
	port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port), nil
}

// of6 asks IP6T_SO_ORIGINAL_DST, which answers a sockaddr_in6 (28 bytes)
// and refuses a shorter buffer; the 32-byte ip6_mtuinfo starts with one.
func of6(fd int) (netip.AddrPort, error) {
	m, err := unix.GetsockoptIPv6MTUInfo(fd, unix.IPPROTO_IPV6, ip6tSOOriginalDst)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST: %w", err)
	}
	// The port field holds the big-endian bytes as they are in memory.
	port := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, m.Addr.Port))
	// The scope of a link-local destination is dropped on purpose: the
	// proxy serves no link-local destination, and an address without its
	// zone cannot be dialled, so such a connection fails closed.
	return netip.AddrPortFrom(netip.AddrFrom16(m.Addr.Addr), port), nil
}
