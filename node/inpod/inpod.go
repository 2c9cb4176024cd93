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
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
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
