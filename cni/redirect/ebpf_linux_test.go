package redirect

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
			t.Fatalf("landed on %s (spec §5.6: app to own pod IP goes direct)", name)
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
