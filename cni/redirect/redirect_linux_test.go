package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/origdst"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// newPair is a pod netns (A, 10.213.0.2) and an outside one (B,
// 10.213.0.1, also holding the probe SNAT address).
func newPair(t *testing.T) pair {
	p := nettest.NewPair(t, netip.MustParsePrefix("10.213.0.0/24"), DefaultProbeSNAT)
	return pair{pod: p.A, out: p.B}
}

type pair struct{ pod, out string }

type listener = nettest.Listener

func in[T any](t *testing.T, ns string, f func() (T, error)) T { return nettest.In(t, ns, f) }

func listen(t *testing.T, ns, addr string) listener { return nettest.Listen(t, ns, addr) }

// originalDst reads SO_ORIGINAL_DST of an accepted connection.
func originalDst(t *testing.T, c net.Conn) netip.AddrPort {
	t.Helper()
	got, err := origdst.Of(c)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// landsOn reports which listener takes the connection dial makes.
func landsOn(t *testing.T, dial func() (net.Conn, error), listeners map[string]listener) (string, net.Conn) {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	deadline := time.After(5 * time.Second)
	for {
		for name, l := range listeners {
			select {
			case got := <-l:
				t.Cleanup(func() { got.Close() })
				return name, got
			default:
			}
		}
		select {
		case <-deadline:
			t.Fatal("no listener accepted the connection")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func dialFrom(t *testing.T, ns string, local netip.Addr, mark int, to string) func() (net.Conn, error) {
	return func() (net.Conn, error) {
		d := net.Dialer{Timeout: 3 * time.Second}
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
}

// networkOf is network ("tcp", "udp") with the family of addr's address.
func networkOf(network, addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Is6() {
		return network + "6"
	}
	return network + "4"
}

// migrateSetting reads net.ipv4.tcp_migrate_req inside ns.
func migrateSetting(t *testing.T, ns string) string {
	t.Helper()
	return strings.TrimSpace(string(in(t, ns, func() ([]byte, error) { return os.ReadFile(MigrateSysctl) })))
}

// setMigrate writes net.ipv4.tcp_migrate_req inside ns.
func setMigrate(t *testing.T, ns, v string) {
	t.Helper()
	in(t, ns, func() (struct{}, error) { return struct{}{}, os.WriteFile(MigrateSysctl, []byte(v), 0o644) })
}

func nftList(t *testing.T, ns string) string {
	t.Helper()
	return string(in(t, ns, func() ([]byte, error) { return exec.Command("nft", "list", "ruleset").CombinedOutput() }))
}

func TestNftablesRedirectsTraffic(t *testing.T) {
	testBackend(t, Nftables{}, nftList, func(t *testing.T, ns string) {
		in(t, ns, func() ([]byte, error) {
			return exec.Command("nft", "delete", "table", "inet", NatTable).CombinedOutput()
		})
	}, "missing chain "+NatTable+"/istio-output")
}

func TestIptablesRedirectsTraffic(t *testing.T) {
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		ci.Unavailable(t, "no iptables-restore (Debian package iptables)")
	}
	save := func(t *testing.T, ns string) string {
		out := string(in(t, ns, func() ([]byte, error) { return exec.Command("iptables-save").CombinedOutput() }))
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			if !strings.HasPrefix(l, "#") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	testBackend(t, Iptables{}, save, func(t *testing.T, ns string) {
		in(t, ns, func() ([]byte, error) {
			return exec.Command("iptables", "-t", "nat", "-F", "ISTIO_OUTPUT").CombinedOutput()
		})
	}, "nat: ISTIO_OUTPUT rules")
}

// enrollAgain enrolls pod a second time with cfg: the kernel state
// (dump) must not change, and Verify must still pass.
func enrollAgain(t *testing.T, b Backend, pod string, cfg PodConfig, dump func(*testing.T, string) string) {
	t.Helper()
	before := dump(t, pod)
	if err := b.Enroll(pod, cfg); err != nil {
		t.Fatal(err)
	}
	if after := dump(t, pod); after != before {
		t.Errorf("state changed on a second Enroll:\n%s\n---\n%s", before, after)
	}
	if err := b.Verify(pod, cfg); err != nil {
		t.Error(err)
	}
}

// testBackend enrolls a real pod netns and sends real connections through
// it; dump shows the backend's state, tamper breaks it behind its back
// (Verify must then report want).
func testBackend(t *testing.T, b Backend, dump func(*testing.T, string) string, tamper func(*testing.T, string), want string) {
	p := newPair(t)
	cfg := DefaultPodConfig()
	if err := b.Verify(p.pod, cfg); err == nil {
		t.Fatal("Verify of a pod without rules passed")
	}
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after Enroll: %v", err)
	}
	if !MigrateSupported() {
		ci.Unavailable(t, "the kernel has no net.ipv4.tcp_migrate_req (Linux 5.14)")
	}
	if got := migrateSetting(t, p.pod); got != "1" {
		t.Errorf("net.ipv4.tcp_migrate_req after Enroll = %q, want 1", got)
	}

	outbound := listen(t, p.pod, "0.0.0.0:15001")
	inbound := listen(t, p.pod, "0.0.0.0:15006")
	hbone := listen(t, p.pod, "0.0.0.0:15008")
	app := listen(t, p.pod, "0.0.0.0:8080")
	outside := listen(t, p.out, "10.213.0.1:9000")
	podSide := map[string]listener{"15001": outbound, "15006": inbound, "15008": hbone, "app": app}

	t.Run("outbound TCP lands on 15001 with its original destination", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, "10.213.0.1:80"), map[string]listener{"15001": outbound, "outside": outside})
		if name != "15001" {
			t.Fatalf("landed on %s", name)
		}
		if got := originalDst(t, c); got.String() != "10.213.0.1:80" {
			t.Errorf("SO_ORIGINAL_DST = %v, want 10.213.0.1:80", got)
		}
	})
	t.Run("the proxy's marked traffic passes", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, ProxyMark, "10.213.0.1:9000"), map[string]listener{"15001": outbound, "outside": outside}); name != "outside" {
			t.Fatalf("landed on %s, want the outside listener", name)
		}
	})
	t.Run("inbound TCP lands on 15006", func(t *testing.T) {
		name, c := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, "10.213.0.2:8080"), podSide)
		if name != "15006" {
			t.Fatalf("landed on %s", name)
		}
		if got := originalDst(t, c); got.String() != "10.213.0.2:8080" {
			t.Errorf("SO_ORIGINAL_DST = %v, want 10.213.0.2:8080", got)
		}
	})
	t.Run("HBONE on 15008 passes straight", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, netip.Addr{}, 0, "10.213.0.2:15008"), podSide); name != "15008" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("a probe from the SNAT address reaches the app", func(t *testing.T) {
		if name, _ := landsOn(t, dialFrom(t, p.out, DefaultProbeSNAT, 0, "10.213.0.2:8080"), podSide); name != "app" {
			t.Fatalf("landed on %s", name)
		}
	})
	t.Run("DNS over UDP lands on 15053", func(t *testing.T) {
		dns := in(t, p.pod, func() (net.PacketConn, error) { return net.ListenPacket("udp4", "0.0.0.0:15053") })
		defer dns.Close()
		c := in(t, p.pod, func() (net.Conn, error) { return net.Dial("udp4", "10.213.0.1:53") })
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

	t.Run("enrolling twice leaves the same state", func(t *testing.T) { enrollAgain(t, b, p.pod, cfg, dump) })

	t.Run("drift is found and repaired", func(t *testing.T) {
		tamper(t, p.pod)
		in(t, p.pod, func() ([]byte, error) {
			return exec.Command("ip", "rule", "del", "priority", fmt.Sprint(RulePriority)).CombinedOutput()
		})
		setMigrate(t, p.pod, "0")
		var drift *DriftError
		err := b.Verify(p.pod, cfg)
		if !errors.As(err, &drift) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "ip rule fwmark") ||
			!strings.Contains(err.Error(), "tcp_migrate_req is 0") {
			t.Fatalf("Verify after tampering = %v, want %q, the ip rule and tcp_migrate_req", err, want)
		}
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, cfg); err != nil {
			t.Fatalf("Verify after repair: %v", err)
		}
		if got := migrateSetting(t, p.pod); got != "1" {
			t.Errorf("net.ipv4.tcp_migrate_req after repair = %q, want 1", got)
		}
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, "10.213.0.1:80"), map[string]listener{"15001": outbound, "outside": outside}); name != "15001" {
			t.Fatalf("after repair, landed on %s", name)
		}
	})

	t.Run("a different configuration is drift", func(t *testing.T) {
		other := cfg
		other.InboundCapture = false
		if err := b.Verify(p.pod, other); err == nil {
			t.Error("Verify with another configuration passed")
		}
	})

	t.Run("unenroll removes everything, twice", func(t *testing.T) {
		for range 2 {
			if err := b.Unenroll(p.pod); err != nil {
				t.Fatal(err)
			}
		}
		if rs := nftList(t, p.pod); strings.Contains(rs, "istio-ambient") || strings.Contains(rs, "ISTIO_") {
			t.Errorf("ruleset after Unenroll:\n%s", rs)
		}
		rules := in(t, p.pod, func() ([]byte, error) { return exec.Command("ip", "rule").CombinedOutput() })
		if bytes.Contains(rules, []byte("lookup 100")) {
			t.Errorf("ip rule left behind:\n%s", rules)
		}
		// Left on by design (MigrateSysctl).
		if got := migrateSetting(t, p.pod); got != "1" {
			t.Errorf("net.ipv4.tcp_migrate_req after Unenroll = %q, want it left at 1", got)
		}
		if name, _ := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, "10.213.0.1:9000"), map[string]listener{"15001": outbound, "outside": outside}); name != "outside" {
			t.Fatalf("after Unenroll, landed on %s", name)
		}
	})
}
