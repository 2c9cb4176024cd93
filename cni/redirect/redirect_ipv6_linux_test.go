package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// dualPair is a dual-stack pod netns (10.214.0.2, fd00:214::2) and an
// outside one (10.214.0.1, fd00:214::1, and both probe SNAT addresses).
// The ULA /64 is the test's own, inside its own namespaces.
type dualPair struct {
	pod, out       string
	pod6, outside6 netip.Addr
	outside4       netip.Addr
}

func newDualPair(t *testing.T) dualPair {
	p := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.214.0.0/24"), netip.MustParsePrefix("fd00:214::/64"),
		DefaultProbeSNAT, DefaultProbeSNATv6)
	return dualPair{pod: p.A, out: p.B, pod6: p.AddrA6, outside6: p.AddrB6, outside4: p.AddrB}
}

func at(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }

func needIptables(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"iptables-restore", "ip6tables-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			ci.Unavailable(t, "no %s (Debian package iptables)", bin)
		}
	}
}

// saveOf runs an iptables-save variant in ns, without its comment lines
// (they hold a timestamp).
func saveOf(bin string) func(*testing.T, string) string {
	return func(t *testing.T, ns string) string {
		out := string(in(t, ns, func() ([]byte, error) { return exec.Command(bin).CombinedOutput() }))
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			if !strings.HasPrefix(l, "#") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
}

// ip6Routing is the pod's IPv6 policy routing, part of every dump.
func ip6Routing(t *testing.T, ns string) string {
	t.Helper()
	return string(in(t, ns, func() ([]byte, error) {
		rules, err := exec.Command("ip", "-6", "rule").CombinedOutput()
		if err != nil {
			return rules, fmt.Errorf("ip -6 rule: %w: %s", err, rules)
		}
		routes, err := exec.Command("ip", "-6", "route", "show", "table", fmt.Sprint(RouteTable)).CombinedOutput()
		if err != nil {
			return routes, fmt.Errorf("ip -6 route: %w: %s", err, routes)
		}
		return append(rules, routes...), nil
	}))
}

// deleteNftRule deletes the first rule of a chain whose text matches re,
// found by its handle in `nft -a list`.
func deleteNftRule(t *testing.T, ns, table, chain string, re *regexp.Regexp) {
	t.Helper()
	listing := in(t, ns, func() ([]byte, error) {
		return exec.Command("nft", "-a", "list", "chain", "inet", table, chain).CombinedOutput()
	})
	for _, line := range strings.Split(string(listing), "\n") {
		if m := regexp.MustCompile(`# handle (\d+)$`).FindStringSubmatch(line); m != nil && re.MatchString(line) {
			in(t, ns, func() ([]byte, error) {
				return exec.Command("nft", "delete", "rule", "inet", table, chain, "handle", m[1]).CombinedOutput()
			})
			return
		}
	}
	t.Fatalf("no rule matching %v in:\n%s", re, listing)
}

func TestNftablesRedirectsIPv6(t *testing.T) {
	dump := func(t *testing.T, ns string) string { return nftList(t, ns) + ip6Routing(t, ns) }
	// Only the IPv6 twin goes: the IPv4 rules stay, so what Verify finds
	// is the IPv6 state's own drift.
	tamper := func(t *testing.T, ns string) {
		deleteNftRule(t, ns, NatTable, "istio-output", regexp.MustCompile(`ip6 daddr != ::1 .*redirect to :15001`))
	}
	testBackendV6(t, Nftables{}, dump, tamper, "chain "+NatTable+"/istio-output has rules")
}

func TestIptablesRedirectsIPv6(t *testing.T) {
	needIptables(t)
	save6 := saveOf("ip6tables-save")
	dump := func(t *testing.T, ns string) string { return save6(t, ns) + ip6Routing(t, ns) }
	tamper := func(t *testing.T, ns string) {
		in(t, ns, func() ([]byte, error) {
			return exec.Command("ip6tables", "-t", "nat", "-F", "ISTIO_OUTPUT").CombinedOutput()
		})
	}
	testBackendV6(t, Iptables{}, dump, tamper, "ip6tables nat: ISTIO_OUTPUT rules")
}

// testBackendV6 is testBackend over IPv6 in a dual-stack pod: the same
// semantics as IPv4 (wire contract §4.2), and IPv4 still captured beside it.
func testBackendV6(t *testing.T, b Backend, dump func(*testing.T, string) string, tamper func(*testing.T, string), want string) {
	p := newDualPair(t)
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after Enroll: %v", err)
	}

	outbound := listen(t, p.pod, "[::]:15001")
	outbound4 := listen(t, p.pod, "0.0.0.0:15001")
	inbound := listen(t, p.pod, "[::]:15006")
	hbone := listen(t, p.pod, "[::]:15008")
	app := listen(t, p.pod, "[::]:8080")
	dnsTCP := listen(t, p.pod, "[::]:15053")
	outside := listen(t, p.out, at(p.outside6, 9000))
	outside4 := listen(t, p.out, at(p.outside4, 9000))
	outSide := map[string]listener{"15001": outbound, "15001 (IPv4)": outbound4, "outside": outside, "outside (IPv4)": outside4}
	podSide := map[string]listener{"15001": outbound, "15006": inbound, "15008": hbone, "app": app}

	t.Run("outbound IPv6 TCP lands on 15001 with its original destination", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside6, 9000)), outSide)
		if name != "15001" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := originalDst(t, c).String(), at(p.outside6, 9000); got != want {
			t.Errorf("IP6T_SO_ORIGINAL_DST = %v, want %v", got, want)
		}
	})
	t.Run("outbound IPv4 TCP of the same pod still lands on 15001", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside4, 9000)), outSide)
		if name != "15001 (IPv4)" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := originalDst(t, c).String(), at(p.outside4, 9000); got != want {
			t.Errorf("SO_ORIGINAL_DST = %v, want %v", got, want)
		}
	})
	t.Run("the proxy's marked IPv6 traffic passes", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, ProxyMark, at(p.outside6, 9000)), outSide); name != "outside" {
			t.Fatalf("landed on %s, want the outside listener", name)
		}
	})
	t.Run("inbound IPv6 TCP lands on 15006", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod6, 8080)), podSide)
		if name != "15006" {
			t.Fatalf("landed on %s", name)
		}
		if got, want := originalDst(t, c).String(), at(p.pod6, 8080); got != want {
			t.Errorf("IP6T_SO_ORIGINAL_DST = %v, want %v", got, want)
		}
	})
	t.Run("IPv6 HBONE on 15008 passes straight", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod6, HBONEPort)), podSide); name != "15008" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("an IPv6 probe from the SNAT address reaches the app", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, DefaultProbeSNATv6, 0, at(p.pod6, 8080)), podSide); name != "app" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("IPv6 DNS over TCP lands on 15053", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside6, 53)), map[string]listener{"15053": dnsTCP, "15001": outbound}); name != "15053" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("IPv6 DNS over UDP lands on [::1]:15053", func(t *testing.T) {
		dns := in(t, p.pod, func() (net.PacketConn, error) { return net.ListenPacket("udp6", "[::1]:15053") })
		defer dns.Close()
		c := in(t, p.pod, func() (net.Conn, error) { return net.Dial("udp6", at(p.outside6, 53)) })
		defer c.Close()
		if _, err := c.Write([]byte("query")); err != nil {
			t.Fatal(err)
		}
		_ = dns.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 16)
		n, _, err := dns.ReadFrom(buf)
		if err != nil || string(buf[:n]) != "query" {
			t.Fatalf("15053 read %q, %v", buf[:n], err)
		}
	})

	t.Run("enrolling twice leaves the same IPv6 state", func(t *testing.T) { enrollAgain(t, b, p.pod, cfg, dump) })

	t.Run("IPv6 drift is found and repaired", func(t *testing.T) {
		tamper(t, p.pod)
		in(t, p.pod, func() ([]byte, error) {
			return exec.Command("ip", "-6", "rule", "del", "priority", fmt.Sprint(RulePriority)).CombinedOutput()
		})
		var drift *DriftError
		err := b.Verify(p.pod, cfg)
		if !errors.As(err, &drift) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "ip -6 rule fwmark") {
			t.Fatalf("Verify after tampering = %v, want %q and the ip -6 rule", err, want)
		}
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, cfg); err != nil {
			t.Fatalf("Verify after repair: %v", err)
		}
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside6, 9000)), outSide); name != "15001" {
			t.Fatalf("after repair, landed on %s", name)
		}
	})

	t.Run("unenroll removes the IPv6 capture", func(t *testing.T) {
		if err := b.Unenroll(p.pod); err != nil {
			t.Fatal(err)
		}
		if d := dump(t, p.pod); strings.Contains(d, "istio-ambient") || strings.Contains(d, "ISTIO_") || strings.Contains(d, "lookup 100") {
			t.Errorf("IPv6 state after Unenroll:\n%s", d)
		}
		if rs := nftList(t, p.pod); strings.Contains(rs, "istio-ambient") || strings.Contains(rs, "ISTIO_") {
			t.Errorf("ruleset after Unenroll:\n%s", rs)
		}
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside6, 9000)), outSide); name != "outside" {
			t.Fatalf("after Unenroll, landed on %s", name)
		}
	})
}

// TestIPv6FailsClosed: with the rules in and nothing serving the proxy's
// ports, an IPv6 connection is refused in the pod; it never reaches its
// destination around the proxy.
func TestIPv6FailsClosed(t *testing.T) {
	for _, b := range []Backend{Nftables{}, Iptables{}} {
		t.Run(b.Name(), func(t *testing.T) {
			if b.Name() == "iptables" {
				needIptables(t)
			}
			p := newDualPair(t)
			if err := b.Enroll(p.pod, DefaultPodConfig()); err != nil {
				t.Fatal(err)
			}
			outside := listen(t, p.out, at(p.outside6, 9000))
			c, err := dialFrom(t, p.pod, netip.Addr{}, 0, at(p.outside6, 9000))()
			if err == nil {
				c.Close()
				t.Fatalf("an IPv6 connection from the pod to %v completed with no proxy listening", at(p.outside6, 9000))
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("dial = %v, want connection refused (by the redirect to [::1]:15001)", err)
			}
			// A handshake the outside completed would be queued by now:
			// the dial returns only after it.
			select {
			case got := <-outside:
				got.Close()
				t.Fatal("the outside accepted a connection from the pod")
			default:
			}
		})
	}
}

// TestIptablesRefusesUncapturedIPv6: where ip6tables cannot run, a pod
// with IPv6 addresses gets no rules and an error, a pod without IPv6 gets
// IPv4 rules, and IPv6 appearing later is drift.
func TestIptablesRefusesUncapturedIPv6(t *testing.T) {
	needIptables(t)
	noIP6tables := Iptables{Restore6: "/nonexistent/ip6tables-restore", Save6: "/nonexistent/ip6tables-save"}
	cfg := DefaultPodConfig()

	t.Run("a pod with IPv6 addresses is refused", func(t *testing.T) {
		p := newDualPair(t)
		err := noIP6tables.Enroll(p.pod, cfg)
		if !errors.Is(err, ErrIPv6Uncaptured) {
			t.Fatalf("Enroll = %v, want ErrIPv6Uncaptured", err)
		}
		if !strings.Contains(err.Error(), p.pod6.String()) {
			t.Errorf("Enroll = %v, want it to name %v", err, p.pod6)
		}
		if rs := saveOf("iptables-save")(t, p.pod); strings.Contains(rs, "ISTIO_") {
			t.Errorf("a refused pod has rules:\n%s", rs)
		}
		if rules := in(t, p.pod, func() ([]byte, error) { return exec.Command("ip", "rule").CombinedOutput() }); bytes.Contains(rules, []byte("lookup 100")) {
			t.Errorf("a refused pod has routing:\n%s", rules)
		}
	})

	t.Run("a pod without IPv6 gets IPv4 rules; IPv6 appearing later is drift", func(t *testing.T) {
		p := newPair(t)
		nettest.SetIPv6(t, p.pod, false, "all", "default")
		if err := noIP6tables.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := noIP6tables.Verify(p.pod, cfg); err != nil {
			t.Fatalf("Verify after Enroll: %v", err)
		}
		nettest.EnableIPv6(t, p.pod)
		err := noIP6tables.Verify(p.pod, cfg)
		if err == nil || !strings.Contains(err.Error(), ErrIPv6Uncaptured.Error()) {
			t.Fatalf("Verify with IPv6 switched on = %v, want %q", err, ErrIPv6Uncaptured)
		}
	})
}
