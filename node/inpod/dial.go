// Connections the proxy makes from inside a pod: TCP dials (from the
// pod's address, or another it owns transparently) and UDP sockets made
// ahead for DNS forwarding.

package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dial connects from inside the pod's namespace with the proxy's mark. A
// UDP dial to an IP address takes a socket made ahead (DialUDP).
func (p *Pod) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if network == "udp" || network == "udp4" || network == "udp6" {
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			return p.DialUDP(ap)
		}
	}
	d := net.Dialer{Control: mark}
	var c net.Conn
	err := p.in(func() (err error) {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// DialFrom connects from inside the pod's namespace with src as the
// source address (IP_TRANSPARENT, IPV6_TRANSPARENT), so the app sees the
// original client; the in-pod rules route the replies back to this socket
// (connmark 0x111, table 100 of either family).
func (p *Pod) DialFrom(ctx context.Context, src netip.Addr, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Control: func(network, address string, c syscall.RawConn) error {
		if err := mark(network, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setTransparent(int(fd), network) }); err != nil {
			return err
		}
		return serr
	}}
	var c net.Conn
	err := p.in(func() (err error) {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Owns reports whether addr is an address of the pod's namespace (its own
// or loopback): whether the kernel lets a socket there bind it without
// IP_TRANSPARENT. It enters the namespace: ask it on rare paths only.
func (p *Pod) Owns(addr netip.Addr) (bool, error) {
	addr = addr.Unmap()
	if addr.IsLoopback() {
		return true, nil
	}
	var family int
	var sa unix.Sockaddr
	switch {
	case addr.Is4():
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: addr.As4()}
	case addr.Is6():
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Addr: addr.As16()}
	default:
		return false, fmt.Errorf("owns %v: not an address", addr)
	}
	var owns bool
	err := p.in(func() error {
		fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("probe socket: %w", err)
		}
		defer unix.Close(fd)
		switch err := unix.Bind(fd, sa); {
		case err == nil:
			owns = true
		case errors.Is(err, unix.EADDRNOTAVAIL):
		default:
			return fmt.Errorf("probe bind to %s: %w", addr, err)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("in pod netns: %w", err)
	}
	return owns, nil
}

// udpBatch is how many UDP sockets one entry into the namespace makes.
const udpBatch = 8

// DialUDP connects a marked UDP socket of the pod's namespace to addr: a
// new socket, so a new random source port, for every dial, as a resolver
// would. The sockets are made ahead, udpBatch at a time: a socket belongs
// to the namespace it was made in whichever thread connects it later, and
// entering the namespace costs more than the DNS query the socket is for
// (about 300 µs of thread hand-over against a 100 µs query, measured by
// bench/dns).
func (p *Pod) DialUDP(addr netip.AddrPort) (net.Conn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	fd, err := p.spareUDP(addr.Addr().Is4())
	if err != nil {
		return nil, err
	}
	var sa unix.Sockaddr
	if addr.Addr().Is4() {
		sa = &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}
	} else {
		sa = &unix.SockaddrInet6{Addr: addr.Addr().As16(), Port: int(addr.Port())}
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	f := os.NewFile(uintptr(fd), "udp:"+addr.String())
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("udp socket to %s: %w", addr, err)
	}
	return c, nil
}

// ListenTransparentUDP opens a UDP socket in the pod's namespace bound to
// from, an address the pod need not own (IP_TRANSPARENT or
// IPV6_TRANSPARENT), with the proxy's mark: what answers a DNS query the
// eBPF redirection handed over unNATed, from the server and port the
// client asked, which is all its resolver accepts an answer from.
// SO_REUSEADDR lets several share the address (two proxies during an
// upgrade). The socket must stay unconnected: a connected one would win
// the kernel's lookup over the redirection and take the client's next
// query to the same server.
func (p *Pod) ListenTransparentUDP(from netip.AddrPort) (*net.UDPConn, error) {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	network := "udp4"
	if from.Addr().Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		if err := mark(network, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if serr == nil {
				serr = transparent(int(fd))
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	var pc net.PacketConn
	err := p.in(func() (err error) {
		pc, err = lc.ListenPacket(context.Background(), network, from.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("UDP socket from %s: %w", from, err)
	}
	return pc.(*net.UDPConn), nil
}

// spareUDP takes a made-ahead socket of the family, making a batch when
// none is left.
func (p *Pod) spareUDP(v4 bool) (int, error) {
	p.udpMu.Lock()
	defer p.udpMu.Unlock()
	spare := &p.spareUDP6
	family := unix.AF_INET6
	if v4 {
		spare, family = &p.spareUDP4, unix.AF_INET
	}
	if len(*spare) == 0 {
		err := p.in(func() error {
			for range udpBatch {
				fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("udp socket: %w", err)
				}
				if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, Mark); err != nil {
					unix.Close(fd)
					return fmt.Errorf("mark udp socket: %w", err)
				}
				*spare = append(*spare, fd)
			}
			return nil
		})
		if len(*spare) == 0 {
			return -1, err
		}
	}
	fd := (*spare)[len(*spare)-1]
	*spare = (*spare)[:len(*spare)-1]
	return fd, nil
}

// closeSpares closes the sockets made ahead.
func (p *Pod) closeSpares() {
	p.udpMu.Lock()
	defer p.udpMu.Unlock()
	for _, fd := range append(p.spareUDP4, p.spareUDP6...) {
		unix.Close(fd)
	}
	p.spareUDP4, p.spareUDP6 = nil, nil
}

// setTransparent lets a socket bind a foreign address, with the option of
// its family: an IPv6 client's address needs IPV6_TRANSPARENT.
func setTransparent(fd int, network string) error {
	if network == "tcp6" {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TRANSPARENT, 1)
	}
	return unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1)
}
