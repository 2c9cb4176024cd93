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
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
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
// the /24, B the second; A routes everything through B.
type Pair struct {
	A, B         string // netns paths
	AddrA, AddrB netip.Addr
}

// NewPair creates a Pair on subnet (a /24 the test owns, e.g.
// 10.213.0.0/24); extraB are more addresses for B (e.g. a probe source).
func NewPair(t testing.TB, subnet netip.Prefix, extraB ...netip.Addr) Pair {
	t.Helper()
	NeedRoot(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	base := subnet.Masked().Addr()
	p := Pair{AddrA: base.Next().Next(), AddrB: base.Next()}
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
	bits := subnet.Bits()
	ends := []struct {
		link, ns string
		addrs    []netip.Prefix
	}{
		{la, p.A, []netip.Prefix{netip.PrefixFrom(p.AddrA, bits)}},
		{lb, p.B, []netip.Prefix{netip.PrefixFrom(p.AddrB, bits)}},
	}
	for _, a := range extraB {
		ends[1].addrs = append(ends[1].addrs, netip.PrefixFrom(a, a.BitLen()))
	}
	for _, end := range ends {
		configure(t, end.link, end.ns, end.addrs, end.ns == p.A, p.AddrB)
	}
	return p
}

func configure(t testing.TB, link, ns string, addrs []netip.Prefix, defaultRoute bool, gw netip.Addr) {
	t.Helper()
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := netlink.LinkSetNsFd(l, int(f.Fd())); err != nil {
		t.Fatal(err)
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
	in, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := h.AddrAdd(in, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []netlink.Link{lo, in} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	if defaultRoute {
		if err := h.RouteAdd(&netlink.Route{Gw: net.IP(gw.AsSlice()), LinkIndex: in.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
	}
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
	l := In(t, path, func() (net.Listener, error) { return net.Listen("tcp4", addr) })
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
