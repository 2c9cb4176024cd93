// Package bpfsteer redirects a test pod's traffic to the node proxy's
// registered sockets the way the CNI agent's eBPF backend does, for tests
// of the proxy's side: nothing NATed, every socket found through the pod's
// socket map (internal/sockmap). The agent's own programs live in cni/,
// which node/ may not import; this is a small stand-in written from the
// same contract:
//
//   - a socket map pinned where the proxy looks for it,
//     sockmap.Dir(root, netns inode)/socks;
//   - policy routing that makes the app's TCP and UDP to port 53 a local
//     delivery (the proxy's marked traffic keeps the main table);
//   - an sk_lookup program that hands outbound TCP to the Outbound slot,
//     TCP to port 53 to DNSTCP and UDP to port 53 to DNSUDP, leaves
//     loopback and the pod's own addresses alone, and drops what finds
//     its slot empty.
//
// Inbound (the agent's tcx program) is not steered.
package bpfsteer

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

// PinMap pins an empty socket map for the netns at path under root, where
// sockmap.Open finds it, and returns it. The pin goes with the test's BPF
// filesystem.
func PinMap(t testing.TB, root, path string) *ebpf.Map {
	t.Helper()
	return pin(t, root, path, &ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: sockmap.Slots})
}

// PinSpec pins a map made from spec where the socket map of the netns at
// path belongs: a test's way of pinning the wrong kind of map.
func PinSpec(t testing.TB, root, path string, spec *ebpf.MapSpec) *ebpf.Map {
	t.Helper()
	return pin(t, root, path, spec)
}

func pin(t testing.TB, root, path string, spec *ebpf.MapSpec) *ebpf.Map {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ino, err := sockmap.Inode(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := sockmap.Dir(root, ino)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Pin(filepath.Join(dir, sockmap.MapFile)); err != nil {
		t.Fatal(err)
	}
	return m
}

// Steer pins a socket map for the netns at path under root and redirects
// the netns's traffic through it until the test ends. self are the pod's
// addresses, which are not captured (one of each family at most; the
// IPv4 one is the source of the app's steered traffic, the IPv6 one of
// its IPv6 traffic, if given).
func Steer(t testing.TB, root, path string, self ...netip.Addr) *ebpf.Map {
	t.Helper()
	m := PinMap(t, root, path)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "steer",
		Type:         ebpf.SkLookup,
		AttachType:   ebpf.AttachSkLookup,
		Instructions: program(m.FD(), self),
		License:      "Apache-2.0",
	})
	if err != nil {
		ci.Unavailable(t, "load an sk_lookup program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := link.AttachNetNs(int(f.Fd()), prog)
	if err != nil {
		t.Fatalf("attach sk_lookup: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	route(t, f, self)
	return m
}

// The capture table, and the rules' preferences (below main's 32766).
const (
	table   = 133
	prefFor = 32001 // the proxy's mark: the main table
	prefTCP = 32003
	prefDNS = 32004
	mark    = 0x539
)

// route makes the app's TCP, and its UDP to port 53, local deliveries: a
// local route in the capture table, whose source is the pod's address.
func route(t testing.TB, ns *os.File, self []netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range self {
		family, all := unix.AF_INET, &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if src.Is6() {
			family, all = unix.AF_INET6, &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		mask := uint32(0xfff)
		proxy := netlink.NewRule()
		proxy.Family, proxy.Priority, proxy.Mark, proxy.Mask, proxy.Table = family, prefFor, mark, &mask, unix.RT_TABLE_MAIN
		tcp := netlink.NewRule()
		tcp.Family, tcp.Priority, tcp.IifName, tcp.IPProto, tcp.Table = family, prefTCP, "lo", unix.IPPROTO_TCP, table
		dns := netlink.NewRule()
		dns.Family, dns.Priority, dns.IifName, dns.IPProto, dns.Dport, dns.Table = family, prefDNS, "lo", unix.IPPROTO_UDP, netlink.NewRulePortRange(53, 53), table
		for _, r := range []*netlink.Rule{proxy, tcp, dns} {
			if err := h.RuleAdd(r); err != nil {
				t.Fatalf("ip rule %v: %v", r, err)
			}
		}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: all, Src: src.AsSlice(), Table: table,
			Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}); err != nil {
			t.Fatalf("local route from %s in table %d: %v", src, table, err)
		}
	}
}

// Offsets in struct bpf_sk_lookup, the program's context.
const (
	offFamily    = 8
	offProtocol  = 12
	offLocalIP4  = 40
	offLocalIP6  = 44
	offLocalPort = 60
)

// Verdicts of an sk_lookup program.
const (
	skDrop = 0
	skPass = 1
)

// program is the sk_lookup program: see the package documentation.
// Addresses are compared as the context holds them, in network order,
// loaded as native words.
func program(mapFD int, self []netip.Addr) asm.Instructions {
	word := func(b []byte) int32 { return int32(binary.NativeEndian.Uint32(b)) }
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, offFamily, asm.Word),
		asm.JEq.Imm(asm.R2, unix.AF_INET, "v4"),
		asm.JEq.Imm(asm.R2, unix.AF_INET6, "v6"),
		asm.Ja.Label("pass"),

		// IPv4: 127/8 and the pod's own address pass.
		asm.LoadMem(asm.R3, asm.R6, offLocalIP4, asm.Word).WithSymbol("v4"),
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.And.Imm(asm.R4, 0xff), // the first byte
		asm.JEq.Imm(asm.R4, 127, "pass"),
	}
	for _, a := range self {
		if a.Is4() {
			b := a.As4()
			insns = append(insns, asm.JEq.Imm32(asm.R3, word(b[:]), "pass"))
		}
	}
	insns = append(insns, asm.Ja.Label("proto"))

	// IPv6: ::1 and the pod's own address pass.
	v6 := append([]netip.Addr{netip.IPv6Loopback()}, self...)
	first := true
	for i, a := range v6 {
		if !a.Is6() {
			continue
		}
		b := a.As16()
		next := fmt.Sprintf("v6-not-%d", i)
		for w := range 4 {
			load := asm.LoadMem(asm.R3, asm.R6, int16(offLocalIP6+4*w), asm.Word)
			if first {
				load, first = load.WithSymbol("v6"), false
			}
			if w < 3 {
				insns = append(insns, load, asm.JNE.Imm32(asm.R3, word(b[4*w:4*w+4]), next))
			} else {
				insns = append(insns, load, asm.JEq.Imm32(asm.R3, word(b[4*w:4*w+4]), "pass"))
			}
		}
		insns = append(insns, asm.Mov.Reg(asm.R3, asm.R3).WithSymbol(next))
	}

	insns = append(insns,
		// The slot, by protocol and port.
		asm.LoadMem(asm.R2, asm.R6, offProtocol, asm.Word).WithSymbol("proto"),
		asm.LoadMem(asm.R3, asm.R6, offLocalPort, asm.Word),
		asm.JEq.Imm(asm.R2, unix.IPPROTO_UDP, "udp"),
		asm.JNE.Imm(asm.R2, unix.IPPROTO_TCP, "pass"),
		asm.Mov.Imm(asm.R7, int32(sockmap.Outbound)),
		asm.JNE.Imm(asm.R3, 53, "assign"),
		asm.Mov.Imm(asm.R7, int32(sockmap.DNSTCP)),
		asm.Ja.Label("assign"),
		asm.JNE.Imm(asm.R3, 53, "pass").WithSymbol("udp"),
		asm.Mov.Imm(asm.R7, int32(sockmap.DNSUDP)),

		// The socket in the slot, or a drop: fail closed.
		asm.StoreMem(asm.RFP, -4, asm.R7, asm.Word).WithSymbol("assign"),
		asm.LoadMapPtr(asm.R1, mapFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkAssign.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.FnSkRelease.Call(),
		asm.JNE.Imm(asm.R9, 0, "drop"),

		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skDrop).WithSymbol("drop"),
		asm.Return(),
	)
	return insns
}
