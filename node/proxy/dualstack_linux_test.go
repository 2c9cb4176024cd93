package proxy

import (
	"net"
	"net/netip"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// TestPodToPodOverIPv6: on dual-stack pods a connection to the server's
// IPv6 address is captured like an IPv4 one and crosses as HBONE over
// IPv6, never as the app's plaintext; the app sees the client's IPv6
// address.
func TestPodToPodOverIPv6(t *testing.T) {
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.228.0.0/24"), netip.MustParsePrefix("fd00:228::/64"))
	m := newMeshOn(t, pair)
	got, err := m.send(t, m.clientNS, net.JoinHostPort(pair.AddrB6.String(), "8080"), "over IPv6")
	if err != nil || got != "over IPv6" {
		t.Fatalf("echo over IPv6 = %q, %v", got, err)
	}
	if n := packets(t, m.serverNS, 8080); n != 0 {
		t.Errorf("%d packets to the app port crossed the link", n)
	}
	if n := packets(t, m.serverNS, 15008); n == 0 {
		t.Error("no packets to 15008")
	}
	if peer := <-m.peers; peer != pair.AddrA6.String() {
		t.Errorf("the app saw the connection from %s, want the client's %s", peer, pair.AddrA6)
	}
	// IPv4 beside it still works.
	if got, err := m.call(t); got != "hello through the mesh" {
		t.Errorf("echo over IPv4 = %q, %v", got, err)
	}
}
