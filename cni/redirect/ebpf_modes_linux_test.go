package redirect

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

func TestEbpfDNSCaptureOff(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	cfg.DNSCapture = false
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	resolver := in(t, p.out, func() (net.PacketConn, error) { return net.ListenPacket("udp4", at(p.out4, 53)) })
	defer resolver.Close()

	if udpArrives(t, p.pod, at(p.out4, 53), proxy.dnsUDP) {
		t.Error("DNS over UDP reached the proxy's DNS socket with capture off")
	}
	if !udpArrives(t, p.pod, at(p.out4, 53), resolver) {
		t.Error("DNS over UDP did not reach the resolver with capture off")
	}
	// TCP to port 53 is outbound TCP like any other then.
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 53)), map[string]listener{"15001": proxy.outbound, "15053": proxy.dnsTCP}); name != "15001" {
		t.Errorf("TCP to port 53 landed on %s, want the outbound listener", name)
	}

	cfg.DNSCapture = true
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if !udpArrives(t, p.pod, at(p.out4, 53), proxy.dnsUDP) {
		t.Error("DNS over UDP did not reach the proxy's DNS socket once capture is on")
	}
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 53)), map[string]listener{"15001": proxy.outbound, "15053": proxy.dnsTCP}); name != "15053" {
		t.Errorf("TCP to port 53 landed on %s once capture is on", name)
	}
}

// TestEbpfMarkedWithoutRouteUnreachable is why rule 32002 exists: a
// marked packet the main table has no route for fails, rather than
// falling into the capture table and looping back into the proxy.
func TestEbpfMarkedWithoutRouteUnreachable(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	if err := b.Enroll(p.pod, DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	// The main table gives up on this range: lookups there fall through
	// to the next rule.
	ipIn(t, p.pod, "route", "add", "throw", "198.18.0.0/15")
	to := "198.18.0.1:80"

	if c, err := dialQuick(p.pod, netip.Addr{}, ProxyMark, to); !errors.Is(err, syscall.ENETUNREACH) {
		if c != nil {
			c.Close()
		}
		t.Errorf("marked dial = %v, want network unreachable", err)
	}
	nothingArrives(t, map[string]listener{"15001": proxy.outbound})
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, to), map[string]listener{"15001": proxy.outbound}); name != "15001" {
		t.Errorf("unmarked dial landed on %s, want it captured", name)
	}

	// Without 32002 the proxy's own connection is captured by itself.
	ipIn(t, p.pod, "rule", "del", "pref", "32002")
	if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, ProxyMark, to), map[string]listener{"15001": proxy.outbound}); name != "15001" {
		t.Errorf("without rule 32002, marked dial landed on %s", name)
	}
	driftHas(t, b.Verify(p.pod, DefaultPodConfig()), "missing ip rule 32002: fwmark 0x539/0xfff unreachable")
}

// TestEbpfTakesOverNetfilterCapture: a pod the nftables or iptables
// backend captured (the agent's backend reconfigured) loses that capture
// when enrolled with eBPF, so no connection is captured twice.
func TestEbpfTakesOverNetfilterCapture(t *testing.T) {
	for _, tc := range []struct {
		backend Backend
		left    string
		dump    func(*testing.T, string) string
	}{
		{Nftables{}, "nftables backend's tables present", nftList},
		{Iptables{}, "iptables backend's chains present", saveOf("iptables-save")},
	} {
		t.Run(tc.backend.Name(), func(t *testing.T) {
			if tc.backend.Name() == "iptables" {
				needIptables(t)
			}
			root := bpffsRoot(t)
			p := newEbpfPair(t)
			b := Ebpf{Root: root}
			cfg := DefaultPodConfig()
			if err := tc.backend.Enroll(p.pod, cfg); err != nil {
				t.Fatal(err)
			}
			driftHas(t, b.Verify(p.pod, cfg), tc.left, "ip rule fwmark 0x111/0xfff lookup 100")
			if err := b.Enroll(p.pod, cfg); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(p.pod, cfg); err != nil {
				t.Fatalf("Verify after Enroll: %v", err)
			}
			if d := tc.dump(t, p.pod); strings.Contains(d, "istio-ambient") || strings.Contains(d, "ISTIO_") {
				t.Errorf("%s state left:\n%s", tc.backend.Name(), d)
			}
			if rules := ipIn(t, p.pod, "rule"); strings.Contains(rules, "lookup 100") {
				t.Errorf("ip rule left:\n%s", rules)
			}
			proxy := startFakeProxy(t, root, p.pod)
			name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 80)), map[string]listener{"15001": proxy.outbound})
			if name != "15001" {
				t.Fatalf("landed on %s", name)
			}
			// A REDIRECT left in place would show 127.0.0.1:15001 here.
			if got, want := addrOf(c.LocalAddr()), netip.AddrPortFrom(p.out4, 80); got != want {
				t.Errorf("local address = %v, want %v", got, want)
			}
		})
	}
}

// TestEbpfDelegatesToNftables: sidecar pods and pods without inbound
// capture get the nftables backend's rules and no eBPF state, and back.
func TestEbpfDelegatesToNftables(t *testing.T) {
	inboundOff := DefaultPodConfig()
	inboundOff.InboundCapture = false
	for _, tc := range []struct {
		name  string
		cfg   PodConfig
		table string
	}{
		{"sidecar", PodConfig{Sidecar: DefaultSidecarConfig()}, SidecarNatTable},
		{"inbound capture off", inboundOff, NatTable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := bpffsRoot(t)
			p := newEbpfPair(t)
			b := Ebpf{Root: root}
			ambient := DefaultPodConfig()
			if err := b.Enroll(p.pod, ambient); err != nil {
				t.Fatal(err)
			}
			dir := podDir(t, root, p.pod)
			if err := b.Enroll(p.pod, tc.cfg); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(p.pod, tc.cfg); err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if sk, tcx := attachedPrograms(t, p.pod); sk != 0 || tcx != 0 {
				t.Errorf("%d sk_lookup and %d tcx programs attached, want none", sk, tcx)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin directory: %v, want none", err)
			}
			if rs := nftList(t, p.pod); !strings.Contains(rs, tc.table) {
				t.Errorf("no table %s:\n%s", tc.table, rs)
			}
			if err := b.Verify(p.pod, ambient); err == nil {
				t.Error("Verify as an eBPF-captured pod passed")
			}
			if tc.cfg.Sidecar == nil {
				// The point of handing it over: an outside client reaches
				// the app, whose replies leave the pod.
				app := appListen(t, p.pod, 8080)
				if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, 8080)), map[string]listener{"app": app}); name != "app" {
					t.Fatalf("landed on %s", name)
				}
			}

			if err := b.Enroll(p.pod, ambient); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(p.pod, ambient); err != nil {
				t.Fatalf("Verify back in eBPF: %v", err)
			}
			if rs := nftList(t, p.pod); strings.Contains(rs, "istio-") {
				t.Errorf("nftables rules left:\n%s", rs)
			}

			if err := b.Enroll(p.pod, tc.cfg); err != nil {
				t.Fatal(err)
			}
			if err := b.Unenroll(p.pod); err != nil {
				t.Fatal(err)
			}
			if rs := nftList(t, p.pod); strings.Contains(rs, "istio-") {
				t.Errorf("nftables rules left after Unenroll:\n%s", rs)
			}
		})
	}
}

func TestEbpfRefuses(t *testing.T) {
	t.Run("reroute interfaces", func(t *testing.T) {
		root := bpffsRoot(t)
		p := newEbpfPair(t)
		cfg := DefaultPodConfig()
		cfg.RerouteInterfaces = []string{"tap0"}
		err := Ebpf{Root: root}.Enroll(p.pod, cfg)
		if !errors.Is(err, ErrEbpfUnsupported) || !strings.Contains(err.Error(), "istio.io/reroute-virtual-interfaces") {
			t.Fatalf("Enroll = %v, want ErrEbpfUnsupported naming the annotation", err)
		}
		if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pins made for a refused pod: %v", err)
		}
	})
	t.Run("two addresses of a family", func(t *testing.T) {
		root := bpffsRoot(t)
		p := newEbpfPair(t)
		ipIn(t, p.pod, "addr", "add", "10.241.0.5/24", "dev", outsideInterface(t, p.pod))
		err := Ebpf{Root: root}.Enroll(p.pod, DefaultPodConfig())
		if !errors.Is(err, ErrEbpfUnsupported) || !strings.Contains(err.Error(), "10.241.0.5") {
			t.Fatalf("Enroll = %v, want ErrEbpfUnsupported naming the addresses", err)
		}
		if sk, tcx := attachedPrograms(t, p.pod); sk != 0 || tcx != 0 {
			t.Errorf("%d sk_lookup and %d tcx programs attached to a refused pod", sk, tcx)
		}
	})
	t.Run("IPv6 without ::1", func(t *testing.T) {
		root := bpffsRoot(t)
		p := newEbpfDualPair(t)
		nettest.SetIPv6(t, p.pod, false, "lo")
		err := Ebpf{Root: root}.Enroll(p.pod, DefaultPodConfig())
		if !errors.Is(err, ErrIPv6Uncaptured) {
			t.Fatalf("Enroll = %v, want ErrIPv6Uncaptured", err)
		}
	})
	t.Run("not a BPF filesystem", func(t *testing.T) {
		needEbpf(t)
		p := newEbpfPair(t)
		err := Ebpf{Root: filepath.Join(t.TempDir(), "canopy")}.Enroll(p.pod, DefaultPodConfig())
		if !errors.Is(err, ErrNotBPFFS) {
			t.Fatalf("Enroll = %v, want ErrNotBPFFS", err)
		}
		if rules := ipIn(t, p.pod, "rule"); strings.Contains(rules, "lookup 133") {
			t.Errorf("routing installed for a refused pod:\n%s", rules)
		}
	})
}

// TestEbpfPodAddressChange: the pod's address is read again by Verify and
// Enroll, which write it to cfg and to the local route's source.
func TestEbpfPodAddressChange(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	dev := outsideInterface(t, p.pod)
	moved := netip.MustParseAddr("10.241.0.3")
	ipIn(t, p.pod, "addr", "del", p.pod4.String()+"/24", "dev", dev)
	ipIn(t, p.pod, "addr", "add", moved.String()+"/24", "dev", dev)
	ipIn(t, p.pod, "route", "replace", "default", "via", p.out4.String())
	driftHas(t, b.Verify(p.pod, cfg), "cfg map: pod IPv4 is 10.241.0.2, want 10.241.0.3", "src 10.241.0.3")
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	proxy := startFakeProxy(t, root, p.pod)
	name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 80)), map[string]listener{"15001": proxy.outbound})
	if name != "15001" {
		t.Fatalf("landed on %s", name)
	}
	if got := addrOf(c.RemoteAddr()).Addr(); got != moved {
		t.Errorf("remote address = %v, want the pod's new %v", got, moved)
	}
}

// TestCheckBPFFS: a pin root is accepted on a BPF filesystem, below it
// when it does not exist yet, and refused elsewhere.
func TestCheckBPFFS(t *testing.T) {
	root := bpffsRoot(t)
	for _, tc := range []struct {
		name string
		dir  string
		want error
	}{
		{"the mount's directory", filepath.Dir(root), nil},
		{"missing, below the mount", filepath.Join(root, "a", "b"), nil},
		{"elsewhere", t.TempDir(), ErrNotBPFFS},
		{"missing, elsewhere", filepath.Join(t.TempDir(), "canopy"), ErrNotBPFFS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkBPFFS(tc.dir); !errors.Is(err, tc.want) {
				t.Errorf("checkBPFFS(%s) = %v, want %v", tc.dir, err, tc.want)
			}
		})
	}
}

// TestEbpfRemoveStaleDirsKeepsLivePods: a directory whose namespace still
// lives is kept whatever the live set says, and removed once it is gone.
func TestEbpfRemoveStaleDirsKeepsLivePods(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	if err := b.Enroll(p.pod, DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	dir := podDir(t, root, p.pod)
	stale := sockmap.Dir(root, 12345)
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	maps, err := openPinnedMaps(stale, true)
	if err != nil {
		t.Fatal(err)
	}
	maps.Close()

	removed, err := b.RemoveStaleDirs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []uint64{12345}) {
		t.Errorf("removed %v, want only the stale 12345", removed)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the live pod's directory: %v", err)
	}

	if err := netns.DeletePath(p.pod); err != nil {
		t.Fatal(err)
	}
	// The kernel tears a namespace down in the background.
	deadline := time.Now().Add(10 * time.Second)
	for {
		removed, err := b.RemoveStaleDirs(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(removed) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the directory of a deleted namespace is still kept: %s", dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory of the deleted namespace: %v", err)
	}
}

// TestEbpfNamespaceWithoutAddresses is the agent's self-test: a fresh
// namespace with only lo, reached through /proc/self/fd, enrolls,
// verifies and un-enrolls.
func TestEbpfNamespaceWithoutAddresses(t *testing.T) {
	root := bpffsRoot(t)
	var id [4]byte
	_, _ = rand.Read(id[:])
	path, err := netns.Create("cnp-ebpf-selftest-" + hex.EncodeToString(id[:]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.DeletePath(path) })
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fdPath := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	b := Ebpf{Root: root}
	for _, cfg := range []PodConfig{DefaultPodConfig(), {Sidecar: DefaultSidecarConfig()}} {
		if err := b.Enroll(fdPath, cfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(fdPath, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Unenroll(fdPath); err != nil {
		t.Fatal(err)
	}
	if sk, tcx := attachedPrograms(t, path); sk != 0 || tcx != 0 {
		t.Errorf("%d sk_lookup and %d tcx programs attached after Unenroll", sk, tcx)
	}
}

// TestEbpfInterfacesComeAndGo: an interface added after Enroll lacks the
// inbound program, one removed leaves a pin behind; Verify reports both,
// Enroll attaches and removes.
func TestEbpfInterfacesComeAndGo(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	// Veth pairs: the kernel here may lack the dummy driver. Both ends
	// are the pod's interfaces.
	ipIn(t, p.pod, "link", "add", "cnpgone0", "type", "veth", "peer", "name", "cnpgone1")
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	dir := podDir(t, root, p.pod)
	if _, err := os.Stat(filepath.Join(dir, tcxLinkFile("cnpgone0"))); err != nil {
		t.Fatalf("no pin for an interface present at Enroll: %v", err)
	}
	ipIn(t, p.pod, "link", "del", "cnpgone0")
	ipIn(t, p.pod, "link", "add", "cnpnew0", "type", "veth", "peer", "name", "cnpnew1")
	driftHas(t, b.Verify(p.pod, cfg),
		"unexpected pinned link "+filepath.Join(dir, tcxLinkFile("cnpgone0")),
		"unexpected pinned link "+filepath.Join(dir, tcxLinkFile("cnpgone1")),
		"interface cnpnew0: no inbound program attached",
		"pinned link "+filepath.Join(dir, tcxLinkFile("cnpnew0"))+" missing")
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, tcxLinkFile("cnpgone0"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin of the removed interface: %v, want it gone", err)
	}
	if _, tcx := attachedPrograms(t, p.pod); tcx != 3 {
		t.Errorf("%d tcx programs attached, want 3 (the pod's veth and both ends of cnpnew0)", tcx)
	}
}

// TestEbpfCapturesLinkLocal: in a pod whose only IPv6 addresses are
// link-local (an IPv4 cluster with IPv6 on in pods), the app's TCP to a
// neighbour's link-local address still goes to the proxy, as the
// nftables backend sends it; global IPv6 destinations get no capture
// route (nothing could leave with a pod source anyway).
func TestEbpfCapturesLinkLocal(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	for _, ns := range []string{p.pod, p.out} {
		enableIPv6NoDAD(t, ns, outsideInterface(t, ns))
	}
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	dev := outsideInterface(t, p.pod)
	routes := strings.TrimSpace(ipIn(t, p.pod, "-6", "route", "show", "table", "133"))
	if !strings.HasPrefix(routes, "local fe80::/10 dev "+dev+" ") || strings.Count(routes, "\n") != 0 {
		t.Errorf("ip -6 route show table 133:\n%s\nwant only the link-local route through %s", routes, dev)
	}
	proxy := startFakeProxy(t, root, p.pod)
	outside := appListen(t, p.out, 9000)
	peer := linkLocal(t, p.out)
	to := netip.AddrPortFrom(peer.WithZone(dev), 9000).String()
	name, c := landsOn(t, func() (net.Conn, error) { return dialQuick(p.pod, netip.Addr{}, 0, to) }, map[string]listener{"15001": proxy.outbound, "outside": outside})
	if name != "15001" {
		t.Fatalf("landed on %s", name)
	}
	if got := addrOf(c.LocalAddr()); got.Addr().WithZone("") != peer || got.Addr().Zone() != dev || got.Port() != 9000 {
		t.Errorf("local address = %v, want %v: the proxy learns the interface too", got, to)
	}
	if name, _ := landsOn(t, func() (net.Conn, error) { return dialQuick(p.pod, netip.Addr{}, ProxyMark, to) }, map[string]listener{"15001": proxy.outbound, "outside": outside}); name != "outside" {
		t.Errorf("the proxy's marked connection landed on %s", name)
	}
}

// enableIPv6NoDAD switches IPv6 on in ns with duplicate address detection
// off from the start, so the link-local addresses are usable at once.
func enableIPv6NoDAD(t *testing.T, ns string, links ...string) {
	t.Helper()
	confs := append([]string{"all", "default", "lo"}, links...)
	in(t, ns, func() (struct{}, error) {
		for _, setting := range []struct{ name, value string }{{"accept_dad", "0"}, {"disable_ipv6", "0"}} {
			for _, c := range confs {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/"+setting.name, []byte(setting.value), 0o644); err != nil {
					return struct{}{}, err
				}
			}
		}
		return struct{}{}, nil
	})
	deadline := time.Now().Add(5 * time.Second)
	for strings.TrimSpace(ipIn(t, ns, "-6", "addr", "show", "tentative")) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 addresses still tentative in %s", ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEbpfIPv6BeforeItsLinkLocalAddress: an interface comes up and gets its
// IPv6 link-local address a moment later. Enroll before the address
// exists still routes IPv6 through the proxy (IPv6 is on), so Verify
// finds no drift once the address is there, and IPv6 is never left
// around the proxy meanwhile.
func TestEbpfIPv6BeforeItsLinkLocalAddress(t *testing.T) {
	root := bpffsRoot(t)
	p := newEbpfPair(t)
	iface := outsideInterface(t, p.pod)
	ipIn(t, p.pod, "-6", "addr", "flush", "dev", iface, "scope", "link")
	if out := ipIn(t, p.pod, "-6", "addr", "show", "dev", iface); strings.Contains(out, "fe80") {
		t.Fatalf("link-local address still there:\n%s", out)
	}
	b := Ebpf{Root: root}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if rules := ipIn(t, p.pod, "-6", "rule"); !strings.Contains(rules, "32003") {
		t.Errorf("no IPv6 capture rule while the interface has no IPv6 address yet:\n%s", rules)
	}
	ipIn(t, p.pod, "-6", "addr", "add", "fe80::5/64", "dev", iface)
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Errorf("drift once the link-local address came: %v", err)
	}
}
