package hostrules

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// TestProbeIsSNATedAndAccepted: from the node, a root-owned connection
// (the probe UID here) to an enrolled pod's app port arrives from the
// probe address and reaches the app, not the proxy's inbound listener.
func TestProbeIsSNATedAndAccepted(t *testing.T) {
	p := nettest.NewPair(t, netip.MustParsePrefix("10.214.0.0/24"))
	rules := testRules(p.B)
	probe(t, p, rules, p.AddrA, netip.MustParseAddr("10.214.0.99"), redirect.DefaultProbeSNAT, Set)

	if err := rules.Delete(); err != nil {
		t.Fatal(err)
	}
	if problems, _ := rules.Verify(nil); len(problems) == 0 {
		t.Error("Verify after Delete found nothing missing")
	}
	if err := rules.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

// TestIPv6ProbeIsSNATedAndAccepted is the same over IPv6 in a dual-stack
// pod: the probe arrives from the IPv6 probe address, which the pod's
// IPv6 rules accept.
func TestIPv6ProbeIsSNATedAndAccepted(t *testing.T) {
	p := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.215.0.0/24"), netip.MustParsePrefix("fd00:215::/64"))
	probe(t, p, testRules(p.B), p.AddrA6, netip.MustParseAddr("fd00:215::99"), redirect.DefaultProbeSNATv6, Set6)
}

func testRules(node string) Rules {
	return Rules{ProbeUID: 0, ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: node}
}

// probe enrolls p.A with podIP in the host set and checks that a probe to
// it is SNATed to snat and reaches the app; then, with podIP out of the set
// (set is where it was), that the pod captures the same connection.
// unlisted is an address never in the set.
func probe(t *testing.T, p nettest.Pair, rules Rules, podIP, unlisted, snat netip.Addr, set string) {
	t.Helper()
	pod, node := p.A, p.B
	if err := rules.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if err := rules.Add(podIP); err != nil {
		t.Fatal(err)
	}
	if problems, err := rules.Verify([]netip.Addr{podIP}); err != nil || len(problems) > 0 {
		t.Fatalf("Verify = %v, %v", problems, err)
	}
	if err := (redirect.Nftables{}).Enroll(pod, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	wildcard := netip.IPv4Unspecified()
	if podIP.Is6() {
		wildcard = netip.IPv6Unspecified()
	}
	app := nettest.Listen(t, pod, netip.AddrPortFrom(wildcard, 8080).String())
	inbound := nettest.Listen(t, pod, netip.AddrPortFrom(wildcard, 15006).String())

	dial := func() {
		t.Helper()
		c := nettest.In(t, node, func() (net.Conn, error) {
			return net.DialTimeout("tcp", netip.AddrPortFrom(podIP, 8080).String(), 3*time.Second)
		})
		c.Close()
	}
	dial()
	select {
	case c := <-app:
		defer c.Close()
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != snat {
			t.Errorf("probe arrived from %s, want %s", got, snat)
		}
	case <-inbound:
		t.Fatal("the probe was captured by 15006")
	case <-time.After(5 * time.Second):
		out := nettest.In(t, pod, func() ([]byte, error) { return exec.Command("sh", "-c", "ss -tan; nft list ruleset").CombinedOutput() })
		t.Fatalf("the probe reached no listener:\n%s", out)
	}

	// Without the pod in the set, the same connection is not SNATed and
	// the pod captures it.
	if err := rules.Remove(podIP, unlisted); err != nil {
		t.Fatal(err)
	}
	if problems, _ := rules.Verify([]netip.Addr{podIP}); len(problems) != 1 || !strings.Contains(problems[0], "set "+set) {
		t.Errorf("Verify after Remove = %v, want the set difference", problems)
	}
	dial()
	select {
	case c := <-inbound:
		c.Close()
	case <-app:
		t.Fatal("an unlisted pod's connection was SNATed")
	case <-time.After(5 * time.Second):
		t.Fatal("no listener got the connection")
	}
}
