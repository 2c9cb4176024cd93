package sockmap

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"golang.org/x/sys/unix"
)

func TestOpenRegisterCookie(t *testing.T) {
	root := nettest.BPFFS(t)
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()

	if m, err := Open(root, self); err != nil || m != nil {
		t.Fatalf("Open without a pinned map = %v, %v; want nil, nil", m, err)
	}

	ino, err := Inode(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(Dir(root, ino), 0o700); err != nil {
		t.Fatal(err)
	}
	pinned, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: Slots})
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if err := pinned.Pin(filepath.Join(Dir(root, ino), MapFile)); err != nil {
		t.Fatal(err)
	}

	m, err := Open(root, self)
	if err != nil || m == nil {
		t.Fatalf("Open = %v, %v; want the pinned map", m, err)
	}
	defer m.Close()
	if _, ok, err := Cookie(m, Outbound); err != nil || ok {
		t.Fatalf("Cookie of an empty slot = %v, %v; want absent", ok, err)
	}

	var lc net.ListenConfig
	lc.SetMultipathTCP(false) // a socket map takes TCP sockets only
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := l.(*net.TCPListener)
	if err := Register(m, Outbound, tl); err != nil {
		t.Fatal(err)
	}
	want, err := SocketCookie(tl)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := Cookie(pinned, Outbound)
	if err != nil || !ok || got != want {
		t.Fatalf("Cookie = %d, %v, %v; want %d", got, ok, err, want)
	}

	// A closed socket leaves its slot by itself.
	l.Close()
	if _, ok, err := Cookie(m, Outbound); err != nil || ok {
		t.Fatalf("Cookie after close = %v, %v; want absent", ok, err)
	}
}

func TestSlotNames(t *testing.T) {
	for s, want := range map[Slot]string{Outbound: "outbound", Inbound: "inbound", DNSTCP: "dns-tcp", DNSUDP: "dns-udp", 7: "slot-7"} {
		if got := s.String(); got != want {
			t.Errorf("Slot(%d) = %q, want %q", s, got, want)
		}
	}
}

func TestMountBPFFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	if ok, err := IsBPFFS(dir); err != nil || ok {
		t.Fatalf("IsBPFFS of a temporary directory = %v, %v", ok, err)
	}
	if err := MountBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if ok, err := IsBPFFS(dir); err != nil || !ok {
		t.Fatalf("IsBPFFS after MountBPFFS = %v, %v", ok, err)
	}
	// A second call finds the filesystem and mounts nothing over it.
	if err := MountBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := IsBPFFS(dir); err != nil || ok {
		t.Fatalf("one unmount left a BPF filesystem: %v, %v", ok, err)
	}
}
