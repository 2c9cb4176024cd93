package redirect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// Test networks of the eBPF backend's tests, used by no other test: the
// pod is 10.241.0.2 (fd00:241::2), the outside 10.241.0.1 (fd00:241::1)
// and both probe SNAT addresses.
var (
	ebpfSubnet  = netip.MustParsePrefix("10.241.0.0/24")
	ebpfSubnet6 = netip.MustParsePrefix("fd00:241::/64")
)

// ebpfTestPair is a pod netns and an outside one.
type ebpfTestPair struct {
	pod, out   string
	pod4, out4 netip.Addr
	pod6, out6 netip.Addr // invalid in an IPv4-only pair
}

func newEbpfPair(t *testing.T) ebpfTestPair {
	t.Helper()
	p := nettest.NewPair(t, ebpfSubnet, DefaultProbeSNAT)
	return ebpfTestPair{pod: p.A, out: p.B, pod4: p.AddrA, out4: p.AddrB}
}

func newEbpfDualPair(t *testing.T) ebpfTestPair {
	t.Helper()
	p := nettest.NewDualStackPair(t, ebpfSubnet, ebpfSubnet6, DefaultProbeSNAT, DefaultProbeSNATv6)
	return ebpfTestPair{pod: p.A, out: p.B, pod4: p.AddrA, out4: p.AddrB, pod6: p.AddrA6, out6: p.AddrB6}
}

// needEbpf skips a test on a kernel that cannot run the programs.
func needEbpf(t *testing.T) {
	t.Helper()
	nettest.NeedRoot(t)
	if err := bpfprog.Probe(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
}

// bpffsRoot mounts a private BPF filesystem for the test's pins, as the
// agent pins under the node's, and returns the Root to use under it.
func bpffsRoot(t *testing.T) string {
	t.Helper()
	needEbpf(t)
	return filepath.Join(nettest.BPFFS(t), "canopy")
}

// fakeProxy stands in for the node proxy's in-pod sockets: plain TCP (a
// SOCKMAP refuses MPTCP), marked 0x539, dual-stack, transparent where the
// proxy's are (15001 and DNS over TCP accept connections for foreign
// addresses), registered in the pod's socket map.
type fakeProxy struct {
	outbound, inbound, hbone, dnsTCP listener
	dnsUDP                           *net.UDPConn
	sockets                          map[sockmap.Slot]syscall.Conn
}

func startFakeProxy(t *testing.T, root, pod string) *fakeProxy {
	t.Helper()
	p := &fakeProxy{sockets: map[sockmap.Slot]syscall.Conn{}}
	var l15001, l15006, l15053 *net.TCPListener
	p.outbound, l15001 = proxyListen(t, pod, OutboundPort, true)
	p.inbound, l15006 = proxyListen(t, pod, InboundPort, false)
	p.hbone, _ = proxyListen(t, pod, HBONEPort, false)
	p.dnsTCP, l15053 = proxyListen(t, pod, DNSPort, true)
	p.dnsUDP = in(t, pod, func() (*net.UDPConn, error) {
		lc := net.ListenConfig{Control: sockopts(true)}
		c, err := lc.ListenPacket(context.Background(), "udp", fmt.Sprintf("[::]:%d", DNSPort))
		if err != nil {
			return nil, err
		}
		return c.(*net.UDPConn), nil
	})
	t.Cleanup(func() { p.dnsUDP.Close() })
	p.sockets[sockmap.Outbound] = l15001
	p.sockets[sockmap.Inbound] = l15006
	p.sockets[sockmap.DNSTCP] = l15053
	p.sockets[sockmap.DNSUDP] = p.dnsUDP
	for s := range p.sockets {
		p.register(t, root, pod, s)
	}
	return p
}

// register puts the proxy's socket of slot s into the pod's map, as the
// node proxy does after binding.
func (p *fakeProxy) register(t *testing.T, root, pod string, s sockmap.Slot) {
	t.Helper()
	withSocks(t, root, pod, func(m *ebpf.Map) {
		if err := sockmap.Register(m, s, p.sockets[s]); err != nil {
			t.Fatal(err)
		}
	})
}

// withSocks runs f with the pod's socket map, found as the node proxy
// finds it.
func withSocks(t *testing.T, root, pod string, f func(*ebpf.Map)) {
	t.Helper()
	ns, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	m, err := sockmap.Open(root, ns)
	if err != nil || m == nil {
		t.Fatalf("open the pod's socket map: %v, %v", m, err)
	}
	defer m.Close()
	f(m)
}

// sockopts marks a socket as the proxy's and, with transparent, lets it
// accept connections for (and bind to) foreign addresses.
func sockopts(transparent bool) func(string, string, syscall.RawConn) error {
	return func(network, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, ProxyMark)
			if serr == nil && transparent {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				if serr == nil && strings.HasSuffix(network, "6") {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				}
			}
		})
		return errors.Join(err, serr)
	}
}

// proxyListen listens as the proxy on [::]:port in the pod.
func proxyListen(t *testing.T, pod string, port int, transparent bool) (listener, *net.TCPListener) {
	t.Helper()
	l := in(t, pod, func() (*net.TCPListener, error) {
		lc := net.ListenConfig{Control: sockopts(transparent)}
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			return nil, err
		}
		return l.(*net.TCPListener), nil
	})
	t.Cleanup(func() { l.Close() })
	return acceptAll(l), l
}

// acceptAll accepts in the background for the listener's whole life.
func acceptAll(l net.Listener) listener {
	ch := make(listener, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

// appListen listens as the app, unmarked, on [::]:port (both families)
// in the pod.
func appListen(t *testing.T, pod string, port int) listener {
	t.Helper()
	l := in(t, pod, func() (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf("[::]:%d", port)) })
	t.Cleanup(func() { l.Close() })
	return acceptAll(l)
}

// addrOf is a socket address without the IPv4-in-IPv6 form a dual-stack
// socket reports IPv4 peers in.
func addrOf(a net.Addr) netip.AddrPort {
	ap := a.(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// dialQuick dials with a short timeout, for connections expected to fail
// closed (a dropped SYN is only noticed by the timeout).
func dialQuick(ns string, local netip.Addr, mark int, to string) (net.Conn, error) {
	d := net.Dialer{Timeout: time.Second}
	if local.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
	}
	if mark != 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
			return errors.Join(err, serr)
		}
	}
	var c net.Conn
	err := netns.Do(ns, func() (err error) { c, err = d.Dial(networkOf("tcp", to), to); return err })
	return c, err
}

// nothingArrives fails if any of the listeners accepted a connection.
func nothingArrives(t *testing.T, listeners map[string]listener) {
	t.Helper()
	for name, l := range listeners {
		select {
		case c := <-l:
			c.Close()
			t.Errorf("%s accepted a connection", name)
		default:
		}
	}
}

// udpExchange sends a datagram from the pod to to and reports whether
// conn (a socket elsewhere) received it.
func udpArrives(t *testing.T, pod, to string, conn net.PacketConn) bool {
	t.Helper()
	c := in(t, pod, func() (net.Conn, error) { return net.Dial(networkOf("udp", to), to) })
	defer c.Close()
	if _, err := c.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 16)
	n, _, err := conn.ReadFrom(buf)
	return err == nil && string(buf[:n]) == "query"
}

// ebpfState is the kernel state of the eBPF backend in a pod, as text: a
// second Enroll must not change it.
func ebpfState(t *testing.T, root, pod string) string {
	t.Helper()
	var b strings.Builder
	ns, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ino, err := sockmap.Inode(ns)
	if err != nil {
		t.Fatal(err)
	}
	dir := sockmap.Dir(root, ino)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fmt.Fprintf(&b, "pin %s", e.Name())
		if strings.HasSuffix(e.Name(), "_link") {
			l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, " link %d program %d", info.ID, info.Program)
		}
		b.WriteString("\n")
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(dir, ebpfCfgFile), nil); err == nil {
		var c bpfprog.Config
		if err := m.Lookup(uint32(0), &c); err != nil {
			t.Fatal(err)
		}
		m.Close()
		fmt.Fprintf(&b, "cfg %+v\n", c)
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(ns.Fd()), Attach: ebpf.AttachSkLookup})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "sk_lookup %v\n", res.Programs)
	b.WriteString(in(t, pod, func() (string, error) {
		var out strings.Builder
		links, err := net.Interfaces()
		if err != nil {
			return "", err
		}
		for _, l := range links {
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&out, "tcx %s %v\n", l.Name, res.Programs)
		}
		for _, args := range [][]string{{"rule"}, {"-6", "rule"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
			o, err := exec.Command("ip", args...).CombinedOutput()
			if err != nil {
				return "", fmt.Errorf("ip %v: %w: %s", args, err, o)
			}
			out.Write(o)
		}
		return out.String(), nil
	}))
	return b.String()
}

// ipIn runs ip in ns and returns its output.
func ipIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	return string(in(t, ns, func() ([]byte, error) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
		return out, nil
	}))
}

// attachedPrograms counts the sk_lookup programs of the pod's namespace
// and the tcx ingress programs of its interfaces.
func attachedPrograms(t *testing.T, pod string) (skLookup, tcx int) {
	t.Helper()
	ns, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(ns.Fd()), Attach: ebpf.AttachSkLookup})
	if err != nil {
		t.Fatal(err)
	}
	tcx = in(t, pod, func() (int, error) {
		links, err := net.Interfaces()
		if err != nil {
			return 0, err
		}
		n := 0
		for _, l := range links {
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return 0, err
			}
			n += len(res.Programs)
		}
		return n, nil
	})
	return len(res.Programs), tcx
}

// podDir is the pod's pin directory under root.
func podDir(t *testing.T, root, pod string) string {
	t.Helper()
	ns, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ino, err := sockmap.Inode(ns)
	if err != nil {
		t.Fatal(err)
	}
	return sockmap.Dir(root, ino)
}

// driftHas fails unless err is a *DriftError with every one of want
// among its problems (as substrings).
func driftHas(t *testing.T, err error, want ...string) {
	t.Helper()
	var drift *DriftError
	if !errors.As(err, &drift) {
		t.Fatalf("Verify = %v, want drift", err)
	}
	for _, w := range want {
		if !slices.ContainsFunc(drift.Problems, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("Verify problems lack %q:\n%s", w, strings.Join(drift.Problems, "\n"))
		}
	}
}
