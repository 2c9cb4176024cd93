package inpod

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/origdst"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

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
		t.Cleanup(func() { r.c.Close() })
		return r.c
	case <-time.After(5 * time.Second):
		t.Fatal("nothing accepted")
	}
	return nil
}

// TestListenersInAnEnrolledPod: the agent's rules send traffic to the
// sockets this package opens, and the proxy's own traffic passes.
func TestListenersInAnEnrolledPod(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.220.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	outside := nettest.Listen(t, pair.B, pair.AddrB.String()+":9000")

	t.Run("outbound from the app lands on 15001", func(t *testing.T) {
		go nettest.In(t, pair.A, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrB.String()+":80", 3*time.Second) })
		c := accept(t, pod.Outbound)
		if dst, err := origdst.Of(c); err != nil || dst.String() != pair.AddrB.String()+":80" {
			t.Errorf("original destination %v, %v", dst, err)
		}
	})
	t.Run("the proxy's own dial passes", func(t *testing.T) {
		c, err := pod.Dial(context.Background(), "tcp4", pair.AddrB.String()+":9000")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case got := <-outside:
			got.Close()
		case <-time.After(5 * time.Second):
			t.Fatal("the marked dial was captured")
		}
	})
	t.Run("inbound plaintext lands on 15006", func(t *testing.T) {
		go nettest.In(t, pair.B, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrA.String()+":8080", 3*time.Second) })
		c := accept(t, pod.Inbound)
		if dst, err := origdst.Of(c); err != nil || dst.String() != pair.AddrA.String()+":8080" {
			t.Errorf("original destination %v, %v", dst, err)
		}
	})
	t.Run("HBONE reaches 15008", func(t *testing.T) {
		go nettest.In(t, pair.B, func() (net.Conn, error) { return net.DialTimeout("tcp4", pair.AddrA.String()+":15008", 3*time.Second) })
		accept(t, pod.HBONE)
	})
}
