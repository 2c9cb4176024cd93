package redirect

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// sidecarPair is a dual-stack pod netns (10.215.0.2, fd00:215::2) and an
// outside one (10.215.0.1, fd00:215::1, and 10.215.9.9 in an excluded
// range). Every address is the test's own, inside its own namespaces.
type sidecarPair struct {
	pod, out         string
	pod4, pod6       netip.Addr
	out4, out6, excl netip.Addr
}

func newSidecarPair(t *testing.T) sidecarPair {
	excl := netip.MustParseAddr("10.215.9.9")
	p := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.215.0.0/24"), netip.MustParsePrefix("fd00:215::/64"), excl)
	return sidecarPair{pod: p.A, out: p.B, pod4: p.AddrA, pod6: p.AddrA6, out4: p.AddrB, out6: p.AddrB6, excl: excl}
}

// dialAs dials to from the netns at path with a socket owned by uid and
// gid, from local when valid. The socket's owner is the creating thread's
// filesystem UID and GID, which the dial sets on a thread of its own: the
// thread stays locked and dies with its goroutine, so no other goroutine
// ever runs with those credentials or in that namespace.
func dialAs(path string, uid, gid int, local netip.Addr, to string) func() (net.Conn, error) {
	return func() (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			c, err := func() (net.Conn, error) {
				f, err := os.Open(path)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
					return nil, fmt.Errorf("setns: %w", err)
				}
				_, _ = unix.SetfsgidRetGid(gid)
				_, _ = unix.SetfsuidRetUid(uid)
				if got, _ := unix.SetfsuidRetUid(-1); got != uid {
					return nil, fmt.Errorf("fsuid is %d, want %d", got, uid)
				}
				if got, _ := unix.SetfsgidRetGid(-1); got != gid {
					return nil, fmt.Errorf("fsgid is %d, want %d", got, gid)
				}
				d := net.Dialer{Timeout: 3 * time.Second}
				if local.IsValid() {
					d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
				}
				return d.Dial(networkOf("tcp", to), to)
			}()
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// sidecarConfig is the default capture with an excluded range, excluded
// ports each way, and the pod's status port (as its annotation gives it).
func sidecarConfig() PodConfig {
	c := DefaultSidecarConfig()
	c.ExcludeOutbound = []netip.Prefix{netip.MustParsePrefix("10.215.9.0/24")}
	c.ExcludeOutboundPorts = []uint16{SidecarStatusPort, 9100}
	c.ExcludeInboundPorts = []uint16{8081, 15099}
	return PodConfig{Sidecar: c}
}

func TestNftablesSidecarCapture(t *testing.T) {
	testSidecar(t, Nftables{}, nftList, func(t *testing.T, ns string) {
		deleteNftRule(t, ns, SidecarNatTable, "istio-output", regexp.MustCompile(`meta skuid 1337 return`))
	}, "chain "+SidecarNatTable+"/istio-output has rules")
}

func TestIptablesSidecarCapture(t *testing.T) {
	needIptables(t)
	dump := func(t *testing.T, ns string) string {
		return saveOf("iptables-save")(t, ns) + saveOf("ip6tables-save")(t, ns)
	}
	testSidecar(t, Iptables{}, dump, func(t *testing.T, ns string) {
		in(t, ns, func() ([]byte, error) {
			return exec.Command("iptables", "-t", "nat", "-D", "ISTIO_OUTPUT", "-m", "owner", "--uid-owner", "1337", "-j", "RETURN").CombinedOutput()
		})
	}, "nat: ISTIO_OUTPUT rules")
}

// testSidecar installs the sidecar capture in a real pod netns and sends
// real connections through it: dump shows the backend's state, tamper
// breaks it (Verify must then report want).
func testSidecar(t *testing.T, b Backend, dump func(*testing.T, string) string, tamper func(*testing.T, string), want string) {
	p := newSidecarPair(t)
	cfg := sidecarConfig()
	if err := b.Verify(p.pod, cfg); err == nil {
		t.Fatal("Verify of a pod without rules passed")
	}
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after Enroll: %v", err)
	}

	outbound := listen(t, p.pod, "0.0.0.0:15001")
	outbound6 := listen(t, p.pod, "[::]:15001")
	inbound := listen(t, p.pod, "0.0.0.0:15006")
	inbound6 := listen(t, p.pod, "[::]:15006")
	app := listen(t, p.pod, "0.0.0.0:8080")
	app6 := listen(t, p.pod, "[::]:8080")
	excludedApp := listen(t, p.pod, "0.0.0.0:8081")
	podSide := map[string]listener{"15001": outbound, "15006": inbound, "app": app, "8081": excludedApp}
	for _, port := range []uint16{HBONEPort, SidecarStatusPort, SidecarReadinessPort, SidecarEnvoyPromPort, 15099} {
		podSide[fmt.Sprint(port)] = listen(t, p.pod, at(netip.IPv4Unspecified(), port))
	}
	outside := listen(t, p.out, at(p.out4, 9000))
	outside9100 := listen(t, p.out, at(p.out4, 9100))
	outside15020 := listen(t, p.out, at(p.out4, SidecarStatusPort))
	outsideExcl := listen(t, p.out, at(p.excl, 9000))
	outside6 := listen(t, p.out, at(p.out6, 9000))
	outSide := map[string]listener{
		"15001": outbound, "15001 (IPv6)": outbound6, "15006": inbound, "app": app,
		"outside": outside, "outside 9100": outside9100, "outside 15020": outside15020, "outside excluded": outsideExcl, "outside (IPv6)": outside6,
	}
	const root = 0

	landsOnWith := func(t *testing.T, dial func() (net.Conn, error), listeners map[string]listener, want, wantDst string) {
		t.Helper()
		name, c := landsOn(t, dial, listeners)
		if name != want {
			t.Fatalf("landed on %s, want %s", name, want)
		}
		if wantDst != "" {
			if got := originalDst(t, c).String(); got != wantDst {
				t.Errorf("original destination = %v, want %v", got, wantDst)
			}
		}
	}

	t.Run("outbound TCP of the app lands on 15001 with its original destination", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.out4, 9000)), outSide, "15001", at(p.out4, 9000))
	})
	t.Run("outbound IPv6 TCP of the app lands on 15001 with its original destination", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.out6, 9000)), outSide, "15001 (IPv6)", at(p.out6, 9000))
	})
	t.Run("the proxy's UID is not captured", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, 4242, netip.Addr{}, at(p.out4, 9000)), outSide, "outside", "")
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, 4242, netip.Addr{}, at(p.out6, 9000)), outSide, "outside (IPv6)", "")
	})
	t.Run("the proxy's GID is not captured", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, 4242, DefaultProxyID, netip.Addr{}, at(p.out4, 9000)), outSide, "outside", "")
	})
	t.Run("an excluded range passes", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.excl, 9000)), outSide, "outside excluded", "")
	})
	t.Run("excluded outbound ports pass", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.out4, 9100)), outSide, "outside 9100", "")
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.out4, SidecarStatusPort)), outSide, "outside 15020", "")
	})
	t.Run("inbound TCP lands on 15006 with its original destination", func(t *testing.T) {
		landsOnWith(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, 8080)), podSide, "15006", at(p.pod4, 8080))
		landsOnWith(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod6, 8080)),
			map[string]listener{"15006 (IPv6)": inbound6, "app": app6}, "15006 (IPv6)", at(p.pod6, 8080))
	})
	t.Run("the proxy's ports and excluded inbound ports are not captured", func(t *testing.T) {
		for _, port := range []uint16{HBONEPort, SidecarStatusPort, SidecarReadinessPort, SidecarEnvoyPromPort, 15099, 8081} {
			want := fmt.Sprint(port)
			if port == 8081 {
				want = "8081"
			}
			landsOnWith(t, dialFrom(t, p.out, netip.Addr{}, 0, at(p.pod4, port)), podSide, want, "")
		}
	})
	t.Run("the app calling its own address or loopback is not captured", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.pod4, 8080)), podSide, "app", "")
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, "127.0.0.1:8080"), podSide, "app", "")
	})
	t.Run("the proxy calling the pod's address lands on 15006", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, DefaultProxyID, netip.Addr{}, at(p.pod4, 8080)), podSide, "15006", at(p.pod4, 8080))
	})
	t.Run("the proxy's passthrough from 127.0.0.6 reaches the app", func(t *testing.T) {
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, DefaultProxyID, netip.MustParseAddr("127.0.0.6"), at(p.pod4, 8080)), podSide, "app", "")
	})

	t.Run("enrolling twice leaves the same state", func(t *testing.T) { enrollAgain(t, b, p.pod, cfg, dump) })

	t.Run("drift is found and repaired", func(t *testing.T) {
		tamper(t, p.pod)
		// Without its RETURN the proxy's own traffic loops into 15001.
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, 4242, netip.Addr{}, at(p.out4, 9000)), outSide, "15001", "")
		err := b.Verify(p.pod, cfg)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Verify after tampering = %v, want %q", err, want)
		}
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, cfg); err != nil {
			t.Fatalf("Verify after repair: %v", err)
		}
		landsOnWith(t, dialAs(p.pod, DefaultProxyID, 4242, netip.Addr{}, at(p.out4, 9000)), outSide, "outside", "")
	})

	t.Run("other settings are drift, and take effect", func(t *testing.T) {
		other := sidecarConfig()
		other.Sidecar.ExcludeOutbound = nil
		if err := b.Verify(p.pod, other); err == nil {
			t.Fatal("Verify with other settings passed")
		}
		if err := b.Enroll(p.pod, other); err != nil {
			t.Fatal(err)
		}
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.excl, 9000)), outSide, "15001", at(p.excl, 9000))
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("DNS capture", func(t *testing.T) {
		dnsCfg := sidecarConfig()
		dnsCfg.Sidecar.DNSCapture = true
		if err := b.Enroll(p.pod, dnsCfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, dnsCfg); err != nil {
			t.Fatalf("Verify: %v", err)
		}
		agent := in(t, p.pod, func() (net.PacketConn, error) { return net.ListenPacket("udp4", "0.0.0.0:15053") })
		defer agent.Close()
		upstream := in(t, p.out, func() (net.PacketConn, error) { return net.ListenPacket("udp4", at(p.out4, 53)) })
		defer upstream.Close()
		query := func(uid int) string {
			t.Helper()
			c, err := dialUDPAs(p.pod, uid, at(p.out4, 53))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("query")); err != nil {
				t.Fatal(err)
			}
			for name, l := range map[string]net.PacketConn{"15053": agent, "upstream": upstream} {
				_ = l.SetReadDeadline(time.Now().Add(time.Second))
				buf := make([]byte, 16)
				if n, _, err := l.ReadFrom(buf); err == nil && string(buf[:n]) == "query" {
					return name
				}
			}
			return "nowhere"
		}
		if got := query(root); got != "15053" {
			t.Errorf("the app's DNS query went to %s, want 15053", got)
		}
		if got := query(DefaultProxyID); got != "upstream" {
			t.Errorf("the proxy's DNS query went to %s, want upstream", got)
		}
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("changing mode replaces the rules", func(t *testing.T) {
		ambient := DefaultPodConfig()
		if err := b.Enroll(p.pod, ambient); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, ambient); err != nil {
			t.Fatalf("Verify ambient after sidecar: %v", err)
		}
		if err := b.Verify(p.pod, cfg); err == nil {
			t.Error("Verify sidecar passed on an ambient pod")
		}
		if err := b.Enroll(p.pod, cfg); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(p.pod, cfg); err != nil {
			t.Fatalf("Verify sidecar after ambient: %v", err)
		}
		d := dump(t, p.pod) + nftList(t, p.pod)
		if strings.Contains(d, "istio-ambient") || strings.Contains(d, "ISTIO_PRERT") {
			t.Errorf("ambient rules left:\n%s", d)
		}
		if rules := in(t, p.pod, func() ([]byte, error) { return exec.Command("ip", "rule").CombinedOutput() }); strings.Contains(string(rules), "lookup 100") {
			t.Errorf("ambient routing left:\n%s", rules)
		}
	})

	t.Run("unenroll removes everything, twice", func(t *testing.T) {
		for range 2 {
			if err := b.Unenroll(p.pod); err != nil {
				t.Fatal(err)
			}
		}
		if rs := nftList(t, p.pod); strings.Contains(rs, "istio-") || strings.Contains(rs, "ISTIO_") {
			t.Errorf("ruleset after Unenroll:\n%s", rs)
		}
		landsOnWith(t, dialAs(p.pod, root, root, netip.Addr{}, at(p.out4, 9000)), outSide, "outside", "")
	})
}

// dialUDPAs is dialAs for UDP.
func dialUDPAs(path string, uid int, to string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see dialAs
		c, err := func() (net.Conn, error) {
			f, err := os.Open(path)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return nil, fmt.Errorf("setns: %w", err)
			}
			_, _ = unix.SetfsgidRetGid(uid)
			_, _ = unix.SetfsuidRetUid(uid)
			return net.Dial("udp4", to)
		}()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// TestEveryConfigRoundTrips installs each golden configuration, one after
// the other in one pod, and verifies it: every rule shape the goldens
// hold reads back from the kernel as written, and each configuration
// replaces the one before, whatever its mode.
func TestEveryConfigRoundTrips(t *testing.T) {
	for _, b := range []Backend{Nftables{}, Iptables{}} {
		t.Run(b.Name(), func(t *testing.T) {
			if b.Name() == "iptables" {
				needIptables(t)
			}
			p := newSidecarPair(t)
			names := slices.Sorted(maps.Keys(configs))
			for range 2 {
				for _, name := range names {
					if err := b.Enroll(p.pod, configs[name]); err != nil {
						t.Fatalf("Enroll %s: %v", name, err)
					}
					if err := b.Verify(p.pod, configs[name]); err != nil {
						t.Errorf("Verify %s: %v", name, err)
					}
				}
			}
			if err := b.Unenroll(p.pod); err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				if err := b.Verify(p.pod, configs[name]); err == nil {
					t.Errorf("Verify %s passed after Unenroll", name)
				}
			}
		})
	}
}
