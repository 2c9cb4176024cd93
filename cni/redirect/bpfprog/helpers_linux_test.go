package bpfprog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
)

var (
	testPod4   = netip.MustParseAddr("192.0.2.10")
	testPod6   = netip.MustParseAddr("2001:db8::10")
	testProbe4 = netip.MustParseAddr("169.254.7.127")
	testProbe6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
)

// testConfig is the cfg value of the test pod.
func testConfig(t *testing.T, dns bool) Config {
	t.Helper()
	c, err := NewConfig(testPod4, testPod6, testProbe4, testProbe6, dns)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newNetns creates a network namespace of a unique name, removed when the
// test ends, so that the test's sockets and lookups see nothing of the
// host's.
func newNetns(t *testing.T) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	path, err := netns.Create("bpfprog-" + hex.EncodeToString(b[:]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.DeletePath(path); err != nil {
			t.Error(err)
		}
	})
	return path
}

// proxySockets are the test's stand-ins for the proxy's sockets, one per
// slot, dual-stack (AF_INET6, not v6-only) so that they accept both
// families, without SO_REUSEPORT, which sk_lookup's test-run refuses.
type proxySockets struct {
	conns   map[int]syscall.Conn
	cookies map[int]uint64
}

// listenProxy opens the sockets of the given slots inside the namespace
// at nsPath.
func listenProxy(t *testing.T, nsPath string, slots ...int) *proxySockets {
	t.Helper()
	p := &proxySockets{conns: map[int]syscall.Conn{}, cookies: map[int]uint64{}}
	var lc net.ListenConfig
	// SOCKMAP refuses MPTCP sockets, Go's default for listeners.
	lc.SetMultipathTCP(false)
	err := netns.Do(nsPath, func() error {
		for _, slot := range slots {
			var c interface {
				syscall.Conn
				Close() error
			}
			if slot == SlotDNSUDP {
				pc, err := lc.ListenPacket(context.Background(), "udp", "[::]:0")
				if err != nil {
					return fmt.Errorf("slot %d: %w", slot, err)
				}
				c = pc.(*net.UDPConn)
			} else {
				l, err := lc.Listen(context.Background(), "tcp", "[::]:0")
				if err != nil {
					return fmt.Errorf("slot %d: %w", slot, err)
				}
				c = l.(*net.TCPListener)
			}
			t.Cleanup(func() { c.Close() })
			var err error
			p.conns[slot] = c
			if p.cookies[slot], err = withFD(c, func(fd int) (uint64, error) {
				return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
			}); err != nil {
				return fmt.Errorf("slot %d cookie: %w", slot, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// register puts every socket in its slot of socks, as the proxy will.
func (p *proxySockets) register(t *testing.T, socks *ebpf.Map) {
	t.Helper()
	for slot, c := range p.conns {
		if _, err := withFD(c, func(fd int) (uint64, error) {
			return 0, socks.Update(uint32(slot), uint64(fd), ebpf.UpdateAny)
		}); err != nil {
			t.Fatalf("register slot %d: %v", slot, err)
		}
	}
}

func withFD(c syscall.Conn, fn func(fd int) (uint64, error)) (uint64, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var v uint64
	var ferr error
	if err := rc.Control(func(fd uintptr) { v, ferr = fn(int(fd)) }); err != nil {
		return 0, err
	}
	return v, ferr
}
