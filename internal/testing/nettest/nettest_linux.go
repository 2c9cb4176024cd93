// Package nettest builds small networks of namespaces for tests that need
// real packets: two network namespaces joined by a veth, addressed and
// routed, removed when the test ends.
package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// NeedRoot skips (fails under CI) a test that needs root, and skips it in
// -short mode.
func NeedRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("root-level test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "network namespaces need root")
	}
}

// Pair is two namespaces joined by a veth: A has the first address of
// the subnet, B the second; A routes everything through B. A dual-stack
// pair has the same in IPv6 (AddrA6, AddrB6; invalid otherwise).
type Pair struct {
	A, B           string // netns paths
	AddrA, AddrB   netip.Addr
	AddrA6, AddrB6 netip.Addr
}

// NewPair creates a Pair on subnet (a /24 the test owns, e.g.
// 10.213.0.0/24); extraB are more addresses for B (e.g. a probe source).
func NewPair(t testing.TB, subnet netip.Prefix, extraB ...netip.Addr) Pair {
	t.Helper()
	return newPair(t, []netip.Prefix{subnet}, extraB)
}

// NewDualStackPair is NewPair with a second, IPv6 subnet (a ULA /64 the
// test owns, e.g. fd00:213::/64) on the same veth; extraB may hold
// addresses of either family. IPv6 is switched on in both namespaces
// whatever the host's defaults, and every IPv6 address skips duplicate
// address detection, so the pair is usable at once.
func NewDualStackPair(t testing.TB, subnet, subnet6 netip.Prefix, extraB ...netip.Addr) Pair {
	t.Helper()
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		ci.Unavailable(t, "the kernel has no IPv6 (ipv6.disable=1?)")
	}
	return newPair(t, []netip.Prefix{subnet, subnet6}, extraB)
}

func newPair(t testing.TB, subnets []netip.Prefix, extraB []netip.Addr) Pair {
	t.Helper()
	NeedRoot(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	var p Pair
	var err error
	for _, side := range []struct {
		dst    *string
		suffix string
	}{{&p.A, "a"}, {&p.B, "b"}} {
		if *side.dst, err = netns.Create("cnp-test-" + id + "-" + side.suffix); err != nil {
			t.Fatal(err)
		}
		path := *side.dst
		t.Cleanup(func() {
			if err := netns.DeletePath(path); err != nil {
				t.Errorf("delete netns: %v", err)
			}
		})
	}
	la, lb := "nta"+id, "ntb"+id
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: la}, PeerName: lb}); err != nil {
		t.Fatal(err)
	}
	// Once moved, the veth goes with the namespaces; an end a failure left
	// in the host's namespace takes its peer with it.
	t.Cleanup(func() {
		for _, name := range []string{la, lb} {
			if l, err := netlink.LinkByName(name); err == nil {
				_ = netlink.LinkDel(l)
			}
		}
	})
	a, bEnd := end{link: la, ns: p.A}, end{link: lb, ns: p.B}
	for _, subnet := range subnets {
		base := subnet.Masked().Addr()
		addrA, addrB := base.Next().Next(), base.Next()
		if base.Is4() {
			p.AddrA, p.AddrB = addrA, addrB
		} else {
			p.AddrA6, p.AddrB6 = addrA, addrB
		}
		a.addrs = append(a.addrs, netip.PrefixFrom(addrA, subnet.Bits()))
		a.gws = append(a.gws, addrB)
		bEnd.addrs = append(bEnd.addrs, netip.PrefixFrom(addrB, subnet.Bits()))
	}
	for _, addr := range extraB {
		bEnd.addrs = append(bEnd.addrs, netip.PrefixFrom(addr, addr.BitLen()))
	}
	for _, e := range []end{a, bEnd} {
		e.configure(t)
	}
	for _, e := range []end{a, bEnd} {
		e.waitUp(t)
	}
	return p
}

// end is one side of the veth: its addresses and its default gateways.
type end struct {
	link, ns string
	addrs    []netip.Prefix
	gws      []netip.Addr
}

func (e end) configure(t testing.TB) {
	t.Helper()
	l, err := netlink.LinkByName(e.link)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(e.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := netlink.LinkSetNsFd(l, int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(e.addrs, func(a netip.Prefix) bool { return a.Addr().Is6() }) {
		EnableIPv6(t, e.ns, e.link)
	}
	h, err := netlink.NewHandleAt(vnetns.NsHandle(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	in, err := h.LinkByName(e.link)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range e.addrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(in, addr); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []netlink.Link{lo, in} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, gw := range e.gws {
		if err := h.RouteAdd(&netlink.Route{Gw: net.IP(gw.AsSlice()), LinkIndex: in.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitUp waits until the kernel has the link operationally up: until it
// has seen the peer's carrier (asynchronously, up to a second after both
// ends are set up), the link's queue drops what is sent, and a test's
// first packet would be lost.
func (e end) waitUp(t testing.TB) {
	t.Helper()
	f, err := os.Open(e.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eventually.True(t, e.link+" in "+e.ns+" operationally up", func() bool {
		l, err := h.LinkByName(e.link)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().OperState == netlink.OperUp
	})
}

// EnableIPv6 switches IPv6 on in the netns at path for lo and links, and
// switches duplicate address detection off there, so addresses (the
// link-local ones too) are usable at once.
func EnableIPv6(t testing.TB, path string, links ...string) {
	t.Helper()
	SetIPv6(t, path, true, append([]string{"all", "default", "lo"}, links...)...)
	In(t, path, func() (struct{}, error) {
		for _, c := range append([]string{"all", "default"}, links...) {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/accept_dad", []byte("0"), 0o644); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
}

// SetIPv6 writes disable_ipv6 of the given interfaces ("all", "default",
// "lo", links) in the netns at path: on switches IPv6 on.
func SetIPv6(t testing.TB, path string, on bool, confs ...string) {
	t.Helper()
	v := "1"
	if on {
		v = "0"
	}
	In(t, path, func() (struct{}, error) {
		for _, c := range confs {
			// /proc/sys/net is the namespace of the thread that opens it.
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/disable_ipv6", []byte(v), 0o644); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
}

// In runs f inside the netns at path and returns its value.
func In[T any](t testing.TB, path string, f func() (T, error)) T {
	t.Helper()
	var v T
	if err := netns.Do(path, func() (err error) { v, err = f(); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// Listener accepts in the background for its whole life, so no stale
// Accept steals a later check's connection.
type Listener chan net.Conn

// Listen listens on addr inside the netns at path.
func Listen(t testing.TB, path, addr string) Listener {
	t.Helper()
	// The family follows the address: "[::]:p" listens to IPv6 only, so
	// a test sees which family landed where.
	network := "tcp4"
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Is6() {
		network = "tcp6"
	}
	l := In(t, path, func() (net.Listener, error) { return net.Listen(network, addr) })
	ch := make(Listener, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() { l.Close() })
	return ch
}

// BPFFS mounts a private BPF filesystem for the test, where the CNI
// agent's eBPF backend and the node proxy find each pod's pins as they do
// under the node's, and returns its root. It is unmounted when the test
// ends, which removes every pin made under it.
func BPFFS(t testing.TB) string {
	t.Helper()
	NeedRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		ci.Unavailable(t, "mount a BPF filesystem: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the BPF filesystem: %v", err)
		}
	})
	return dir
}
