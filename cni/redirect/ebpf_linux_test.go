package redirect

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// TestEbpfRedirectsTraffic enrolls a real pod netns with the eBPF backend,
// stands in for the node proxy, and sends real connections through it.
func TestEbpfRedirectsTraffic(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Verify(p.pod, cfg); err == nil {
		t.Fatal("Verify of a pod without eBPF state passed")
	}
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after Enroll: %v", err)
	}
	if got := migrateSetting(t, p.pod); MigrateSupported() && got != "1" {
		t.Errorf("net.ipv4.tcp_migrate_req after Enroll = %q, want 1", got)
	}
	empty, err := b.Unregistered(p.pod)
	if err != nil || len(empty) != sockmap.Slots {
		t.Errorf("Unregistered before the proxy registers = %v, %v; want every slot", empty, err)
	}

	proxy := startFakeProxy(t, root, p.pod)
	app := appListen(t, p.pod, 8080)
	outside := listen(t, p.out, at(p.out4, 9000))
	outSide := map[string]listener{"15001": proxy.outbound, "15053": proxy.dnsTCP, "outside": outside}
	podSide := map[string]listener{"15001": proxy.outbound, "15006": proxy.inbound, "15008": proxy.hbone, "app": app}

	if empty, err := b.Unregistered(p.pod); err != nil || len(empty) != 0 {
		t.Errorf("Unregistered with every socket registered = %v, %v; want none", empty, err)
	}

	t.Run("outbound TCP lands on 15001, getsockname is the original destination", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 80)), outSide)
		if name != "15001" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(p.out4, 80); got != want {
			t.Errorf("local address = %v, want the original destination %v", got, want)
		}
		if got := addrOf(c.RemoteAddr()).Addr(); got != p.pod4 {
			t.Errorf("remote address = %v, want the pod's %v", got, p.pod4)
		}
	})
	t.Run("the proxy's marked traffic passes", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, ProxyMark, at(p.out4, 9000)), outSide); name != "outside" {
			t.Fatalf("landed on %s, want the outside listener", name)
		}
	})
	t.Run("inbound TCP lands on 15006 with the pod's address", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, 8080)), podSide)
		if name != "15006" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(p.pod4, 8080); got != want {
			t.Errorf("local address = %v, want %v", got, want)
		}
		if got := addrOf(c.RemoteAddr()).Addr(); got != p.out4 {
			t.Errorf("remote address = %v, want the client's %v", got, p.out4)
		}
	})
	t.Run("HBONE on 15008 reaches the 15008 listener", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, HBONEPort)), podSide); name != "15008" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("a probe from the SNAT address reaches the app", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, DefaultProbeSNAT, 0, at(p.pod4, 8080)), podSide); name != "app" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("DNS over TCP lands on the DNS listener", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 53)), outSide)
		if name != "15053" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(p.out4, 53); got != want {
			t.Errorf("local address = %v, want %v", got, want)
		}
	})
	t.Run("DNS over UDP lands on the DNS socket", func(t *testing.T) {
		if !udpArrives(t, p.pod, at(p.out4, 53), proxy.dnsUDP) {
			t.Fatal("the proxy's DNS socket did not receive the query")
		}
	})
	t.Run("the proxy's spoofed connection to the app gets its replies", func(t *testing.T) {
		// The proxy connects to the app from the client's address
		// (IP_TRANSPARENT); the app's replies are addressed to the
		// client, and must come back to the proxy's socket over lo.
		c := in(t, p.pod, func() (net.Conn, error) {
			d := net.Dialer{Control: sockopts(true), LocalAddr: &net.TCPAddr{IP: p.out4.AsSlice()}, Timeout: 3 * time.Second}
			return d.Dial("tcp4", at(p.pod4, 8080))
		})
		defer c.Close()
		accepted := <-app
		defer accepted.Close()
		if got := addrOf(accepted.RemoteAddr()).Addr(); got != p.out4 {
			t.Errorf("the app sees %v, want the client's %v", got, p.out4)
		}
		if _, err := accepted.Write([]byte("reply")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "reply" {
			t.Fatalf("the proxy read %q, %v", buf, err)
		}
	})
	t.Run("an app's connection to its own address is not captured", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.pod4, 8080)), podSide); name != "app" {
			t.Fatalf("landed on %s (an app's connection to its own pod IP goes direct with eBPF)", name)
		}
	})

	t.Run("empty slots fail closed", func(t *testing.T) {
		withSocks(t, root, p.pod, func(m *ebpf.Map) {
			for _, s := range []sockmap.Slot{sockmap.Outbound, sockmap.Inbound} {
				if err := m.Delete(uint32(s)); err != nil {
					t.Fatal(err)
				}
			}
		})
		defer proxy.register(t, root, p.pod, sockmap.Outbound)
		defer proxy.register(t, root, p.pod, sockmap.Inbound)
		empty, err := b.Unregistered(p.pod)
		if err != nil || !slices.Equal(empty, []sockmap.Slot{sockmap.Outbound, sockmap.Inbound}) {
			t.Errorf("Unregistered = %v, %v; want outbound and inbound", empty, err)
		}
		if err := b.Verify(p.pod, cfg); err != nil {
			t.Errorf("Verify with empty slots = %v, want no drift (the proxy fills them)", err)
		}
		if c, err := dialQuick(p.pod, netip.Addr{}, 0, at(p.out4, 9000)); err == nil {
			c.Close()
			t.Error("outbound connection established with the outbound slot empty")
		}
		if c, err := dialQuick(p.out, netip.Addr{}, 0, at(p.pod4, 8080)); err == nil {
			c.Close()
			t.Error("inbound connection established with the inbound slot empty")
		}
		nothingArrives(t, map[string]listener{"outside": outside, "app": app, "15001": proxy.outbound, "15006": proxy.inbound})
	})
}

// TestEbpfUnenrollLeavesNothing: no program, rule, route or pin is left,
// twice over, and the pod's traffic then goes direct.
func TestEbpfUnenrollLeavesNothing(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfDualPair(t)
	b := Ebpf{Root: root}
	if err := b.Enroll(p.pod, DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	outside := listen(t, p.out, at(p.out4, 9000))
	outSide := map[string]listener{"15001": proxy.outbound, "outside": outside}
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 9000)), outSide); name != "15001" {
		t.Fatalf("before Unenroll, landed on %s", name)
	}
	dir := podDir(t, root, p.pod)
	for range 2 {
		if err := b.Unenroll(p.pod); err != nil {
			t.Fatal(err)
		}
	}
	if sk, tcx := attachedPrograms(t, p.pod); sk != 0 || tcx != 0 {
		t.Errorf("after Unenroll: %d sk_lookup and %d tcx programs attached, want none", sk, tcx)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pin directory %s after Unenroll: %v, want it gone", dir, err)
	}
	for _, fam := range [][]string{{"rule"}, {"-6", "rule"}} {
		if rules := ipIn(t, p.pod, fam...); strings.Contains(rules, "3200") || strings.Contains(rules, "lookup 133") {
			t.Errorf("ip %v after Unenroll:\n%s", fam, rules)
		}
	}
	for _, fam := range [][]string{{"route", "show", "table", "133"}, {"-6", "route", "show", "table", "133"}} {
		if routes := ipIn(t, p.pod, fam...); strings.TrimSpace(routes) != "" {
			t.Errorf("ip %v after Unenroll:\n%s", fam, routes)
		}
	}
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 9000)), outSide); name != "outside" {
		t.Fatalf("after Unenroll, landed on %s", name)
	}
	if _, err := b.Unregistered(p.pod); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Unregistered of an un-enrolled pod = %v, want fs.ErrNotExist", err)
	}
}

// TestEbpfRedirectsIPv6 is TestEbpfRedirectsTraffic over IPv6 in a
// dual-stack pod, IPv4 still captured beside it.
func TestEbpfRedirectsIPv6(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfDualPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after Enroll: %v", err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	app := appListen(t, p.pod, 8080)
	outside := listen(t, p.out, at(p.out6, 9000))
	outSide := map[string]listener{"15001": proxy.outbound, "15053": proxy.dnsTCP, "outside": outside}
	podSide := map[string]listener{"15001": proxy.outbound, "15006": proxy.inbound, "15008": proxy.hbone, "app": app}

	for _, dst := range []netip.Addr{p.out6, p.out4} {
		t.Run("outbound TCP to "+dst.String()+" lands on 15001", func(t *testing.T) {
			name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(dst, 80)), outSide)
			if name != "15001" {
				t.Fatalf("landed on %s", name)
			}
			if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(dst, 80); got != want {
				t.Errorf("local address = %v, want the original destination %v", got, want)
			}
			want := p.pod4
			if dst.Is6() {
				want = p.pod6
			}
			if got := addrOf(c.RemoteAddr()).Addr(); got != want {
				t.Errorf("remote address = %v, want the pod's %v (the local route's src)", got, want)
			}
		})
	}
	t.Run("the proxy's marked IPv6 traffic passes", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, ProxyMark, at(p.out6, 9000)), outSide); name != "outside" {
			t.Fatalf("landed on %s, want the outside listener", name)
		}
	})
	t.Run("inbound IPv6 TCP lands on 15006", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod6, 8080)), podSide)
		if name != "15006" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(p.pod6, 8080); got != want {
			t.Errorf("local address = %v, want %v", got, want)
		}
	})
	t.Run("inbound TCP to the pod's link-local address lands on 15006", func(t *testing.T) {
		ll, peer := linkLocal(t, p.pod), outsideInterface(t, p.out)
		to := netip.AddrPortFrom(ll.WithZone(peer), 8080).String()
		name, c := landsOn(t, func() (net.Conn, error) { return dialQuick(p.out, netip.Addr{}, 0, to) }, podSide)
		if name != "15006" {
			t.Fatalf("landed on %s", name)
		}
		if got := addrOf(c.LocalAddr()).Addr().WithZone(""); got != ll {
			t.Errorf("local address = %v, want %v", got, ll)
		}
	})
	t.Run("outbound TCP to a link-local address lands on 15001", func(t *testing.T) {
		dev := outsideInterface(t, p.pod)
		to := netip.AddrPortFrom(linkLocal(t, p.out).WithZone(dev), 9000).String()
		name, c := landsOn(t, func() (net.Conn, error) { return dialQuick(p.pod, netip.Addr{}, 0, to) }, outSide)
		if name != "15001" {
			t.Fatalf("landed on %s", name)
		}
		if got := addrOf(c.LocalAddr()).String(); got != to {
			t.Errorf("local address = %v, want %v", got, to)
		}
	})
	t.Run("IPv6 HBONE reaches the 15008 listener", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod6, HBONEPort)), podSide); name != "15008" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("an IPv6 probe from the SNAT address reaches the app", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, DefaultProbeSNATv6, 0, at(p.pod6, 8080)), podSide); name != "app" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("IPv6 DNS over TCP and UDP land on the DNS sockets", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out6, 53)), outSide); name != "15053" {
			t.Fatalf("TCP landed on %s", name)
		}
		if !udpArrives(t, p.pod, at(p.out6, 53), proxy.dnsUDP) {
			t.Fatal("the proxy's DNS socket did not receive the UDP query")
		}
	})
	t.Run("the proxy's spoofed IPv6 connection to the app gets its replies", func(t *testing.T) {
		c := in(t, p.pod, func() (net.Conn, error) {
			d := net.Dialer{Control: sockopts(true), LocalAddr: &net.TCPAddr{IP: p.out6.AsSlice()}, Timeout: 3 * time.Second}
			return d.Dial("tcp6", at(p.pod6, 8080))
		})
		defer c.Close()
		accepted := <-app
		defer accepted.Close()
		if _, err := accepted.Write([]byte("reply")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "reply" {
			t.Fatalf("the proxy read %q, %v", buf, err)
		}
	})
	t.Run("unenroll sends IPv6 direct", func(t *testing.T) {
		if err := b.Unenroll(p.pod); err != nil {
			t.Fatal(err)
		}
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out6, 9000)), outSide); name != "outside" {
			t.Fatalf("after Unenroll, landed on %s", name)
		}
	})
}

// linkLocal is the IPv6 link-local address of the pod's interface.
func linkLocal(t *testing.T, ns string) netip.Addr {
	t.Helper()
	return in(t, ns, func() (netip.Addr, error) {
		ifs, err := net.Interfaces()
		if err != nil {
			return netip.Addr{}, err
		}
		for _, i := range ifs {
			addrs, err := i.Addrs()
			if err != nil {
				return netip.Addr{}, err
			}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.(*net.IPNet).IP); ok && ip.Unmap().Is6() && ip.IsLinkLocalUnicast() {
					return ip, nil
				}
			}
		}
		return netip.Addr{}, errors.New("no link-local address")
	})
}

// outsideInterface is the name of the outside end of the veth, the zone
// of the pod's link-local address seen from there.
func outsideInterface(t *testing.T, ns string) string {
	t.Helper()
	return in(t, ns, func() (string, error) {
		ifs, err := net.Interfaces()
		if err != nil {
			return "", err
		}
		for _, i := range ifs {
			if i.Flags&net.FlagLoopback == 0 {
				return i.Name, nil
			}
		}
		return "", errors.New("no interface")
	})
}

// TestEbpfEnrollKeepsState: Enroll again, by a new Ebpf value as after an
// agent restart, changes nothing; the pins alone keep traffic steered once
// every Go object is gone; a new configuration is written to cfg without
// touching the links; another program is swapped back in place by
// Link.Update, keeping the link.
func TestEbpfEnrollKeepsState(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfDualPair(t)
	cfg := DefaultPodConfig()
	func() {
		// The enrolling value and everything it opened go out of scope.
		if err := (Ebpf{Root: root}).Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
	}()
	runtime.GC()
	runtime.GC()
	proxy := startFakeProxy(t, root, p.pod)
	outside := listen(t, p.out, at(p.out4, 9000))
	outSide := map[string]listener{"15001": proxy.outbound, "outside": outside}
	steered := func(t *testing.T) {
		t.Helper()
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 9000)), outSide); name != "15001" {
			t.Fatalf("landed on %s", name)
		}
	}
	t.Run("pins keep traffic steered", steered)

	restarted := Ebpf{Root: root}
	t.Run("a second Enroll changes nothing", func(t *testing.T) {
		before := ebpfState(t, root, p.pod)
		if err := restarted.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if after := ebpfState(t, root, p.pod); after != before {
			t.Errorf("state changed on a second Enroll:\n%s\n---\n%s", before, after)
		}
		if err := restarted.Verify(p.pod, cfg); err != nil {
			t.Error(err)
		}
		if empty, err := restarted.Unregistered(p.pod); err != nil || len(empty) != 0 {
			t.Errorf("Unregistered after re-Enroll = %v, %v; want the proxy's registrations kept", empty, err)
		}
		steered(t)
	})

	t.Run("a new configuration keeps the links", func(t *testing.T) {
		links := pinnedLinks(t, root, p.pod)
		other := cfg
		other.DNSCapture = false
		if err := restarted.Verify(p.pod, other); err == nil {
			t.Fatal("Verify with DNS capture off passed on a pod enrolled with it")
		} else {
			driftHas(t, err, "cfg map: DNS capture is on, want off", "unexpected ip rule 32004")
		}
		if err := restarted.Enroll(p.pod, other); err != nil {
			t.Fatal(err)
		}
		if err := restarted.Verify(p.pod, other); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(links, pinnedLinks(t, root, p.pod)); diff != "" {
			t.Errorf("links changed with the configuration (-before +after):\n%s", diff)
		}
		if err := restarted.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("another program is swapped by Link.Update", func(t *testing.T) {
		before := pinnedLinks(t, root, p.pod)
		// A program of another Canopy version, say: sk_lookup passing
		// everything, which Verify cannot tell from Canopy's.
		stranger, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.SkLookup, AttachType: ebpf.AttachSkLookup, License: "Apache-2.0",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer stranger.Close()
		l, err := link.LoadPinnedLink(filepath.Join(podDir(t, root, p.pod), ebpfSkLookupFile), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = l.Update(stranger)
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		driftHas(t, restarted.Verify(p.pod, cfg), "is not Canopy's", "no sk_lookup program attached")
		// Routed local and steered nowhere, the connection finds no
		// socket; the kernel's reset would come from a foreign source
		// address, which it does not send, so the dial times out.
		if c, err := dialQuick(p.pod, netip.Addr{}, 0, at(p.out4, 9000)); err == nil {
			c.Close()
			t.Error("a connection completed under the stranger program")
		}
		nothingArrives(t, outSide)
		if err := restarted.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := restarted.Verify(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		after := pinnedLinks(t, root, p.pod)
		if after[ebpfSkLookupFile].Link != before[ebpfSkLookupFile].Link {
			t.Errorf("sk_lookup link %d replaced by %d, want it updated in place", before[ebpfSkLookupFile].Link, after[ebpfSkLookupFile].Link)
		}
		if after[ebpfSkLookupFile].Program == before[ebpfSkLookupFile].Program {
			t.Error("the sk_lookup link runs the program it ran before the swap; want a new one")
		}
		steered(t)
	})
}

type pinnedLink struct{ Link, Program uint32 }

// pinnedLinks are the links pinned for the pod, by file, with their
// programs.
func pinnedLinks(t *testing.T, root, pod string) map[string]pinnedLink {
	t.Helper()
	dir := podDir(t, root, pod)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]pinnedLink{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "_link") {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = pinnedLink{uint32(info.ID), uint32(info.Program)}
	}
	return out
}

// TestEbpfRepairsDrift breaks what Enroll made behind its back: Verify
// reports each problem, Enroll repairs all, Verify is clean and traffic
// steered again.
func TestEbpfRepairsDrift(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfDualPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	app := appListen(t, p.pod, 8080)
	outside := listen(t, p.out, at(p.out4, 9000))
	dir := podDir(t, root, p.pod)
	iface := outsideInterface(t, p.pod) // the pod's only interface but lo

	for _, file := range []string{ebpfSkLookupFile, tcxLinkFile(iface)} {
		l, err := link.LoadPinnedLink(filepath.Join(dir, file), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Detach(); err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	ipIn(t, p.pod, "rule", "del", "pref", "32003")
	ipIn(t, p.pod, "-6", "rule", "del", "pref", "32001")
	ipIn(t, p.pod, "-6", "rule", "add", "pref", "32002", "lookup", "main")
	ipIn(t, p.pod, "route", "add", "blackhole", "198.18.0.0/15", "table", "133")
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, ebpfCfgFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := bpfprog.NewConfig(netip.MustParseAddr("10.241.0.99"), p.pod6, DefaultProbeSNAT, DefaultProbeSNATv6, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := bpfprog.PutConfig(m, wrong); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if MigrateSupported() {
		setMigrate(t, p.pod, "0")
	}

	err = b.Verify(p.pod, cfg)
	want := []string{
		"no sk_lookup program attached to the pod's network namespace",
		"pinned link " + filepath.Join(dir, ebpfSkLookupFile) + " is not attached",
		"interface " + iface + ": no inbound program attached",
		"pinned link " + filepath.Join(dir, tcxLinkFile(iface)) + " is not attached to " + iface,
		"missing ip rule 32003: iif lo ipproto tcp lookup 133",
		"missing ip -6 rule 32001: fwmark 0x539/0xfff lookup main",
		"unexpected ip -6 rule 32002: lookup main",
		"unexpected ip route table 133: blackhole 198.18.0.0/15",
		"cfg map: pod IPv4 is 10.241.0.99, want 10.241.0.2",
		"cfg map: DNS capture is off, want on",
	}
	if MigrateSupported() {
		want = append(want, "tcp_migrate_req is 0")
	}
	driftHas(t, err, want...)
	t.Logf("Verify: %v", err)

	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after repair: %v", err)
	}
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 9000)), map[string]listener{"15001": proxy.outbound, "outside": outside}); name != "15001" {
		t.Fatalf("outbound after repair landed on %s", name)
	}
	if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, 8080)), map[string]listener{"15006": proxy.inbound, "app": app}); name != "15006" {
		t.Fatalf("inbound after repair landed on %s", name)
	}
}
