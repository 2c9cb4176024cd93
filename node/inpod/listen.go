// The proxy's listeners in a pod: opened inside its namespace, marked,
// transparent where the redirection needs it, and registered in the pod's
// socket map when the eBPF backend redirects it.

package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/sockmap"
)

func mark(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, Mark)
	}); err != nil {
		return err
	}
	return serr
}

// Listen opens the proxy's listeners in the namespace and, if the pod has
// a socket map under opts.BPFRoot, puts them in it (see register). On an
// error the caller closes the Pod, which closes what was opened: a pod
// whose map cannot be opened or filled is not served at all, rather than
// served by sockets its traffic never reaches.
func (p *Pod) Listen(opts Options) error {
	m, err := p.socketMap(opts.BPFRoot)
	if err != nil {
		return err
	}
	steered := m != nil
	if steered {
		defer m.Close() // the map keeps the sockets, not this handle
	}
	err = p.in(func() error {
		for _, l := range []struct {
			dst  *net.Listener
			port int
		}{{&p.Outbound, OutboundPort}, {&p.Inbound, InboundPort}, {&p.HBONE, HBONEPort}} {
			var err error
			if *l.dst, err = listen(l.port); err != nil {
				return fmt.Errorf("listen on %d: %w", l.port, err)
			}
		}
		if opts.DNS {
			return p.listenDNS(steered)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("in pod netns: %w", err)
	}
	if !steered {
		return nil
	}
	if err := p.register(m); err != nil {
		return fmt.Errorf("eBPF redirection: %w", err)
	}
	p.SocketMap = true
	return nil
}

// socketMap opens the pod's socket map, or returns nil when root is empty
// or the agent pinned none for the pod.
func (p *Pod) socketMap(root string) (*ebpf.Map, error) {
	if root == "" {
		return nil, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.netns == nil {
		return nil, ErrClosed
	}
	m, err := sockmap.Open(root, p.netns)
	if err != nil {
		return nil, fmt.Errorf("eBPF redirection: %w", err)
	}
	return m, nil
}

// register readies the sockets the agent's programs hand traffic to and
// puts each in its slot of m, replacing what the slot held. During an
// upgrade that is the old proxy's socket: from then on the programs hand
// new traffic to this proxy's (the kernel may still pick the old one of
// the SO_REUSEPORT group), and the old one leaves the map by itself when
// it closes. Every socket is open before the first slot is written, so
// a pod that cannot be listened in leaves the old proxy's registration
// as it was.
//
// 15001 and the DNS TCP listener take connections to addresses the pod
// does not own (the app's remote destination, its resolver):
// IP_TRANSPARENT lets their SYN-ACK leave from there, which the kernel
// refuses otherwise for IPv4 (IPv6 needs no flag). 15006 takes
// connections to the pod's own address and needs nothing. The DNS UDP socket reports each query's destination
// (IP_RECVORIGDSTADDR), which its answer must come from.
func (p *Pod) register(m *ebpf.Map) error {
	type slotSocket struct {
		slot sockmap.Slot
		c    syscall.Conn
		prep func(fd int) error
	}
	slots := []slotSocket{
		{sockmap.Outbound, p.Outbound.(syscall.Conn), transparent},
		{sockmap.Inbound, p.Inbound.(syscall.Conn), nil},
	}
	if len(p.DNSTCP) > 0 {
		// The last DNS sockets are those for both families (listenDNS).
		slots = append(slots,
			slotSocket{sockmap.DNSTCP, p.DNSTCP[len(p.DNSTCP)-1].(syscall.Conn), transparent},
			slotSocket{sockmap.DNSUDP, p.DNSUDP[len(p.DNSUDP)-1].(syscall.Conn), recvOrigDst})
	}
	for _, s := range slots {
		if s.prep == nil {
			continue
		}
		raw, err := s.c.SyscallConn()
		if err != nil {
			return fmt.Errorf("%s socket: %w", s.slot, err)
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = s.prep(int(fd)) }); err != nil {
			return fmt.Errorf("%s socket: %w", s.slot, err)
		}
		if serr != nil {
			return fmt.Errorf("%s socket: %w", s.slot, serr)
		}
	}
	for _, s := range slots {
		if err := sockmap.Register(m, s.slot, s.c); err != nil {
			return err
		}
	}
	return nil
}

// transparent sets IP_TRANSPARENT, or IPV6_TRANSPARENT on an IPv6
// socket (the same flag, which then covers its IPv4 traffic too).
func transparent(fd int) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("SO_DOMAIN: %w", err)
	}
	if domain == unix.AF_INET6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TRANSPARENT, 1)
	} else {
		err = unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1)
	}
	if err != nil {
		return fmt.Errorf("IP_TRANSPARENT: %w", err)
	}
	return nil
}

// recvOrigDst asks for each datagram's destination address and port: an
// IPv6 socket taking both families reports its IPv4 datagrams' at the
// IPv4 level (IP_ORIGDSTADDR) and its IPv6 ones' at the IPv6 level.
func recvOrigDst(fd int) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("SO_DOMAIN: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1); err != nil {
		return fmt.Errorf("IP_RECVORIGDSTADDR: %w", err)
	}
	if domain == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR, 1); err != nil {
			return fmt.Errorf("IPV6_RECVORIGDSTADDR: %w", err)
		}
	}
	return nil
}

// AnotherProxyListens reports whether a listener other than this Pod's
// holds the outbound port in the namespace: during an upgrade, the old
// node proxy still serving the pod. Ask before Listen (after it, the
// Pod's own listener would answer).
//
// It binds a probe socket to the port with SO_REUSEADDR and without
// SO_REUSEPORT: Linux refuses that bind (EADDRINUSE) while a socket
// listens on the port, and allows it beside the connections a closed
// listener left open, which are no longer serving new ones.
func (p *Pod) AnotherProxyListens() (bool, error) {
	var held bool
	err := p.in(func() error {
		family, addr := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: OutboundPort})
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			family, addr = unix.AF_INET, &unix.SockaddrInet4{Port: OutboundPort}
			fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		}
		if err != nil {
			return fmt.Errorf("probe socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fmt.Errorf("probe socket: %w", err)
		}
		if family == unix.AF_INET6 {
			// A dual socket overlaps every listener of the port,
			// whichever family it took.
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
				return fmt.Errorf("probe socket: %w", err)
			}
		}
		switch err := unix.Bind(fd, addr); {
		case errors.Is(err, unix.EADDRINUSE):
			held = true
		case err != nil:
			return fmt.Errorf("probe bind on %d: %w", OutboundPort, err)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("in pod netns: %w", err)
	}
	return held, nil
}

// listenDNS opens 15053 on the loopback addresses the pod's redirection
// sends DNS to (a local REDIRECT lands on 127.0.0.1 or ::1). [::1] is
// skipped where the namespace has no IPv6 loopback (IPv6 disabled, or a
// kernel without it): its pods send no IPv6 DNS to capture. Called inside
// the namespace.
//
// A steered pod's queries are handed to one socket of each protocol
// whatever their family, which none of those can take: an IPv4 socket
// takes no IPv6, and the kernel makes an IPv6 socket bound to ::1 IPv6
// only. So a steered pod gets one more of each, last: IPv6 with
// IPV6_V6ONLY off on [::]:15053, bound to the loopback device
// (SO_BINDTODEVICE). Of what the kernel delivers by itself, that takes
// only datagrams and connections to a loopback address, which the
// 127.0.0.1 and ::1 sockets take first: neither the pod's network nor
// the pod at its own address reaches it. Where the kernel has no IPv6,
// 127.0.0.1's sockets are the last, and the pod has no IPv6 DNS.
func (p *Pod) listenDNS(steered bool) error {
	type bind struct {
		ip           string
		udp, tcp     string
		optionalV6   bool
		dualLoopback bool
	}
	binds := []bind{{"127.0.0.1", "udp4", "tcp4", false, false}, {"::1", "udp6", "tcp6", true, false}}
	if steered {
		binds = append(binds, bind{"::", "udp6", "tcp6", true, true})
	}
	for _, a := range binds {
		addr := net.JoinHostPort(a.ip, fmt.Sprint(DNSPort))
		lc := listenConfig(a.dualLoopback)
		if a.dualLoopback {
			lc = onLoopback(lc)
		}
		pc, err := lc.ListenPacket(context.Background(), a.udp, addr)
		if a.optionalV6 && (errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.EAFNOSUPPORT)) {
			continue
		}
		if err != nil {
			return fmt.Errorf("listen on udp %s: %w", addr, err)
		}
		p.DNSUDP = append(p.DNSUDP, pc)
		l, err := lc.Listen(context.Background(), a.tcp, addr)
		if err != nil {
			return fmt.Errorf("listen on tcp %s: %w", addr, err)
		}
		p.DNSTCP = append(p.DNSTCP, l)
	}
	return nil
}

// onLoopback binds lc's sockets to the loopback device, on top of its
// other settings.
func onLoopback(lc *net.ListenConfig) *net.ListenConfig {
	ctl := lc.Control
	out := *lc
	out.Control = func(network, address string, c syscall.RawConn) error {
		if err := ctl(network, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo")
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("SO_BINDTODEVICE lo: %w", serr)
		}
		return nil
	}
	return &out
}

// listen opens a wildcard listener on port for both families: one AF_INET6
// socket with IPV6_V6ONLY off, so IPv4 arrives v4-mapped and IPv6 the pod's
// rules redirect lands on the same socket. Go's "tcp" on ":port" would pick
// such a socket only where its process-wide probe found IPv6, and that probe
// ran in whichever namespace first asked, not in this pod's. A kernel
// without IPv6 cannot make the socket; its pods have no IPv6 to capture, so
// IPv4 alone is served.
func listen(port int) (net.Listener, error) {
	dual := listenConfig(true)
	l, err := dual.Listen(context.Background(), "tcp6", fmt.Sprintf("[::]:%d", port))
	if errors.Is(err, unix.EAFNOSUPPORT) {
		v4 := listenConfig(false)
		return v4.Listen(context.Background(), "tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	}
	return l, err
}

// listenConfig marks the proxy's sockets and sets SO_REUSEPORT as ztunnel
// does: a restarting proxy's new sockets can bind while the old ones drain
// (wire contract §3.4). No process of the pod joins that group: the CNI
// agent refuses a bind to these ports in an ambient pod to every process
// but the node proxies that connected to it (cni/README.md, "The node
// proxy's ports in a pod"), which is why a bind here can fail with EPERM. A dual socket takes both families: Go has set
// IPV6_V6ONLY on a "tcp6" socket before Control runs, and this clears it.
// The listeners are plain TCP, never MPTCP (Go's default for listeners):
// a redirection that hands connections to a listener socket itself (an
// eBPF socket map, bpf_sk_assign) takes TCP sockets only, and nothing
// arriving redirected from inside the pod speaks MPTCP.
func listenConfig(dual bool) *net.ListenConfig {
	lc := &net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		if err := mark(network, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			if serr == nil && dual {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	lc.SetMultipathTCP(false)
	return lc
}
