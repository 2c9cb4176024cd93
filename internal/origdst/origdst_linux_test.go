package origdst

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// TestDestinationOnRealSockets: a REDIRECTed connection is read from
// conntrack, one that reached the listener unNATed falls back to its
// local address, and one made to the proxy's own port is refused.
func TestDestinationOnRealSockets(t *testing.T) {
	pair := nettest.NewDualStackPair(t, netip.MustParsePrefix("10.253.0.0/24"), netip.MustParsePrefix("fd00:253::/64"))
	const proxyPort = 15001
	// The app's TCP to port 80 is redirected to the listener; to port 81
	// it leaves untouched.
	script := "table inet origdst-test {\n chain out {\n  type nat hook output priority -100; policy accept;\n  tcp dport 80 redirect to :15001\n }\n}\n"
	if out := nettest.In(t, pair.A, func() ([]byte, error) {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		return cmd.CombinedOutput()
	}); len(out) > 0 {
		t.Fatalf("nft: %s", out)
	}
	l := nettest.In(t, pair.A, func() (net.Listener, error) { return net.Listen("tcp", "[::]:15001") })
	defer l.Close()
	// The peer's listeners stand for connections that reached a listener
	// with nothing NATed (the eBPF redirection's case): no conntrack in
	// its namespace has an entry for them. Its 15001 is a proxy's own.
	peer := nettest.In(t, pair.B, func() (net.Listener, error) { return net.Listen("tcp", ":81") })
	defer peer.Close()
	peerProxy := nettest.In(t, pair.B, func() (net.Listener, error) { return net.Listen("tcp", ":15001") })
	defer peerProxy.Close()
	own := func(a netip.AddrPort) bool {
		return a.Port() == proxyPort && (a.Addr().IsLoopback() || a.Addr() == pair.AddrB || a.Addr() == pair.AddrB6)
	}

	for _, tc := range []struct {
		name    string
		from    string
		to      netip.AddrPort
		l       net.Listener
		want    netip.AddrPort
		wantErr error
	}{
		{"REDIRECTed IPv4: SO_ORIGINAL_DST", pair.A, netip.AddrPortFrom(pair.AddrB, 80), l, netip.AddrPortFrom(pair.AddrB, 80), nil},
		{"REDIRECTed IPv6: IP6T_SO_ORIGINAL_DST", pair.A, netip.AddrPortFrom(pair.AddrB6, 80), l, netip.AddrPortFrom(pair.AddrB6, 80), nil},
		{"unNATed IPv4: the local address", pair.A, netip.AddrPortFrom(pair.AddrB, 81), peer, netip.AddrPortFrom(pair.AddrB, 81), nil},
		{"unNATed IPv6: the local address", pair.A, netip.AddrPortFrom(pair.AddrB6, 81), peer, netip.AddrPortFrom(pair.AddrB6, 81), nil},
		{"unNATed to the proxy's own port: refused", pair.A, netip.AddrPortFrom(pair.AddrB, proxyPort), peerProxy, netip.AddrPort{}, ErrOwnListener},
		{"unNATed to the proxy's own IPv6 port: refused", pair.A, netip.AddrPortFrom(pair.AddrB6, proxyPort), peerProxy, netip.AddrPort{}, ErrOwnListener},
		{"unNATed to the proxy's port on loopback: refused", pair.B, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), proxyPort), peerProxy, netip.AddrPort{}, ErrOwnListener},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dialed := make(chan error, 1)
			go func() {
				dialed <- netns.Do(tc.from, func() error {
					c, err := net.DialTimeout("tcp", tc.to.String(), 3*time.Second)
					if err == nil {
						defer c.Close()
						_, err = c.Read(make([]byte, 1)) // until the test closes its side
					}
					return err
				})
			}()
			c := accept(t, tc.l)
			got, err := Destination(c, own)
			c.Close()
			<-dialed
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("Destination: %v, %v; want error %v", got, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("Destination = %v, want %v", got, tc.want)
			}
		})
	}
}

func accept(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := l.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.c
	case <-time.After(5 * time.Second):
		t.Fatal("nothing accepted")
	}
	return nil
}
