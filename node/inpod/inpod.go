// Package inpod opens the node proxy's sockets inside a pod's network
// namespace (docs/wire-contract.md §3.4, §5.1): 15001 for redirected outbound
// traffic, 15006 for inbound plaintext, 15008 for HBONE, and, when asked,
// 15053 for DNS on the pod's loopback (UDP and TCP); every socket marked
// 0x539 so the pod's redirection rules let the proxy's own traffic pass. The
// namespace comes from the CNI agent over ZDS, never from a guess.
//
// A pod redirected by the agent's eBPF programs rather than by netfilter
// has a socket map pinned for it (internal/sockmap): Listen puts the
// sockets in it, and the programs hand the pod's traffic to them unNATed.
package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// Ports and mark (wire contract §4.1).
const (
	OutboundPort = 15001
	InboundPort  = 15006
	HBONEPort    = 15008
	DNSPort      = 15053
	Mark         = 0x539
)

// IsPort reports whether port is one the proxy listens on in every pod
// (15001, 15006, 15008, 15053).
func IsPort(port uint16) bool {
	switch port {
	case OutboundPort, InboundPort, HBONEPort, DNSPort:
		return true
	}
	return false
}

// ErrClosed is a dial from a Pod already closed.
var ErrClosed = errors.New("pod closed")

// Pod is the proxy's presence in one pod's network namespace. Its methods
// are safe for concurrent use.
type Pod struct {
	// Outbound, Inbound and HBONE listen on 15001, 15006 and 15008.
	Outbound, Inbound, HBONE net.Listener
	// DNSUDP and DNSTCP are 15053 on 127.0.0.1 and, where the pod's
	// loopback has IPv6, on [::1]; empty unless Options.DNS.
	DNSUDP []net.PacketConn
	DNSTCP []net.Listener

	// SocketMap is set by Listen when the pod has a socket map: its
	// traffic reaches these sockets through the CNI agent's eBPF
	// programs, unNATed, so a connection's local address and a DNS
	// query's destination are where the app sent them, not the socket's
	// own address.
	SocketMap bool

	// mu guards the namespace handle: a dial holds it shared for as long
	// as it is inside, so that Close never frees the descriptor number
	// under it (a number reused by another pod's handle would put the
	// dial in that pod).
	mu    sync.RWMutex
	netns *os.File // nil once closed

	// udpMu guards the UDP sockets made ahead for DialUDP, by family.
	udpMu                sync.Mutex
	spareUDP4, spareUDP6 []int
}

// path names the namespace through the held handle, valid as long as the
// handle is open, whatever happened to the path it came from; callers
// hold mu and have checked netns.
func (p *Pod) path() string { return fmt.Sprintf("/proc/self/fd/%d", p.netns.Fd()) }

// in runs fn inside the pod's namespace, unless the pod is closed.
func (p *Pod) in(fn func() error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.netns == nil {
		return ErrClosed
	}
	return netns.Do(p.path(), fn)
}

func mark(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, Mark)
	}); err != nil {
		return err
	}
	return serr
}

// Options are what Open opens besides the three TCP listeners, and where
// it looks for the pod's socket map.
type Options struct {
	// DNS opens 15053 (UDP and TCP) on the pod's loopback.
	DNS bool
	// BPFRoot is where the CNI agent pins each eBPF-redirected pod's
	// socket map (sockmap.DefaultRoot on a node); empty looks for none,
	// as for a pod redirected by netfilter.
	BPFRoot string
}

// Open listens inside the namespace; it takes ownership of ns.
func Open(ns *os.File) (*Pod, error) { return OpenWith(ns, Options{}) }

// OpenWith is Open with options; it takes ownership of ns.
func OpenWith(ns *os.File, opts Options) (*Pod, error) {
	p := Attach(ns)
	if err := p.Listen(opts); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Attach holds the namespace without opening a socket in it (Listen
// opens them); it takes ownership of ns.
func Attach(ns *os.File) *Pod { return &Pod{netns: ns} }

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

// Holds reports whether f names the network namespace this Pod is in: the
// same namespace handed over again (a CNI agent that restarted sends every
// pod anew) needs no new listeners.
func (p *Pod) Holds(f *os.File) (bool, error) {
	var other unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &other); err != nil {
		return false, fmt.Errorf("stat the handed network namespace: %w", err)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.netns == nil {
		return false, nil
	}
	var own unix.Stat_t
	if err := unix.Fstat(int(p.netns.Fd()), &own); err != nil {
		return false, fmt.Errorf("stat the pod's network namespace: %w", err)
	}
	return own.Dev == other.Dev && own.Ino == other.Ino, nil
}

// NamespaceID is the device and inode of the pod's network namespace:
// what names it among the node's processes (/proc/<pid>/ns/net).
func (p *Pod) NamespaceID() (dev, ino uint64, err error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.netns == nil {
		return 0, 0, ErrClosed
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(p.netns.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("stat the pod's network namespace: %w", err)
	}
	return st.Dev, st.Ino, nil
}

// Close closes the listeners and the namespace handle; dials after it
// fail with ErrClosed. It is safe to repeat.
func (p *Pod) Close() error {
	errs := []error{p.closeTCP()}
	for _, pc := range p.DNSUDP {
		errs = append(errs, closeConn(pc))
	}
	p.closeSpares()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.netns != nil {
		errs = append(errs, p.netns.Close())
		p.netns = nil
	}
	return errors.Join(errs...)
}
