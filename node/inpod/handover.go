// Handing a pod's traffic over to another proxy: listeners that stop
// taking connections while the kernel migrates what was queued, and DNS
// sockets that finish what they hold before they close.

package inpod

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CloseListeners stops taking connections and DNS queries: the listeners
// close, and the connections the kernel had queued for them go to the
// pod's other listeners on the same ports (another proxy's) where the
// namespace migrates them (MigratesRequests), and are reset otherwise.
// The DNS UDP sockets are detached first and closed DNSLinger later (see
// detach): the queries queued on them and the answers under way are not
// lost. Dials still work, for the connections already accepted. It is
// safe to repeat.
func (p *Pod) CloseListeners() error {
	errs := []error{p.closeTCP()}
	var lingering []net.PacketConn
	for _, pc := range p.DNSUDP {
		if err := detach(pc); err != nil {
			errs = append(errs, closeConn(pc))
			continue
		}
		lingering = append(lingering, pc)
	}
	if len(lingering) > 0 {
		time.AfterFunc(DNSLinger, func() {
			for _, pc := range lingering {
				_ = pc.Close()
			}
		})
	}
	return errors.Join(errs...)
}

// DNSLinger is how long a detached DNS socket is still read and answered
// from: the longest a forwarded query waits for the pod's resolvers (the
// DNS server's default forward timeout).
const DNSLinger = 5 * time.Second

func (p *Pod) closeTCP() error {
	var errs []error
	for _, l := range append([]net.Listener{p.Outbound, p.Inbound, p.HBONE}, p.DNSTCP...) {
		if l != nil {
			if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func closeConn(pc net.PacketConn) error {
	if err := pc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// detach stops a UDP socket from taking new datagrams while what is queued
// on it stays readable and its answers can still be sent: connected to its
// own address, it no longer matches a query from any client, so the kernel
// gives new queries to the other sockets of its SO_REUSEPORT group (the
// other proxy's) and, if there are none, refuses them (ICMP port
// unreachable: the pod's resolver moves on at once). Closing it instead
// would drop its queue, a query a client waits its whole timeout (5 s in
// glibc) for.
func detach(pc net.PacketConn) error {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		return fmt.Errorf("detach a %T: not a UDP socket", pc)
	}
	own, ok := uc.LocalAddr().(*net.UDPAddr)
	if !ok {
		return fmt.Errorf("detach: local address %v", uc.LocalAddr())
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var sa unix.Sockaddr
	switch ip4 := own.IP.To4(); {
	case ip4 != nil:
		sa4 := &unix.SockaddrInet4{Port: own.Port}
		copy(sa4.Addr[:], ip4)
		sa = sa4
	case own.IP.IsUnspecified():
		// The socket for both families (listenDNS) is bound to no
		// address: 127.0.0.1, v4-mapped, is one of its own, and there
		// whether or not the pod has IPv6.
		sa = &unix.SockaddrInet6{Port: own.Port, Addr: netip.AddrFrom4([4]byte{127, 0, 0, 1}).As16()}
	default:
		sa6 := &unix.SockaddrInet6{Port: own.Port}
		copy(sa6.Addr[:], own.IP.To16())
		sa = sa6
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) { cerr = unix.Connect(int(fd), sa) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("detach %s: %w", own, cerr)
	}
	return nil
}

// MigratesRequests reports whether the pod's namespace hands a closing
// listener's queued connections to the other listeners of its
// SO_REUSEPORT group (net.ipv4.tcp_migrate_req, which the CNI agent turns
// on). A kernel without the setting reports false and no error.
func (p *Pod) MigratesRequests() (bool, error) {
	var b []byte
	err := p.in(func() (err error) {
		b, err = os.ReadFile(migrateSysctl)
		return err
	})
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read net.ipv4.tcp_migrate_req: %w", err)
	}
	return strings.TrimSpace(string(b)) != "0", nil
}

// migrateSysctl is net.ipv4.tcp_migrate_req; /proc/sys/net shows the
// namespace of the thread that opens it.
const migrateSysctl = "/proc/sys/net/ipv4/tcp_migrate_req"
