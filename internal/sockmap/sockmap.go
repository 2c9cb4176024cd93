// Package sockmap is the contract between the CNI agent's eBPF redirection
// backend and the node proxy: where a pod's socket map is pinned, and which
// of the proxy's sockets each slot holds.
//
// The agent creates the map when it enrolls a pod and pins it under
// <root>/<netns inode>/socks; its programs steer captured traffic to the
// sockets in the slots. The proxy finds the map through the inode of the
// pod's netns, which it already holds, and puts its listeners in. Nothing
// crosses the ZDS socket, so ZDS stays Istio's protocol; a pod without a
// pinned map is redirected by netfilter, and the proxy registers nothing.
//
// A socket leaves the map by itself when it is closed. An empty slot makes
// the programs drop the traffic, so a pod whose proxy has not registered
// fails closed.
package sockmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// DefaultRoot is where the agent pins each pod's programs and maps, under
// the node's BPF filesystem.
const DefaultRoot = "/sys/fs/bpf/canopy"

// MapFile is the socket map's name in a pod's directory.
const MapFile = "socks"

// Slot is a key of the socket map.
type Slot uint32

// The slots, and the proxy's socket each holds.
const (
	Outbound Slot = 0 // TCP listener on 15001
	Inbound  Slot = 1 // TCP listener on 15006
	DNSTCP   Slot = 2 // TCP listener on 15053
	DNSUDP   Slot = 3 // UDP socket on 15053

	// Slots is the number of slots, the map's size.
	Slots = 4
)

func (s Slot) String() string {
	switch s {
	case Outbound:
		return "outbound"
	case Inbound:
		return "inbound"
	case DNSTCP:
		return "dns-tcp"
	case DNSUDP:
		return "dns-udp"
	}
	return "slot-" + strconv.Itoa(int(s))
}

// Dir is the directory of the pod whose network namespace has the inode
// ino.
func Dir(root string, ino uint64) string {
	return filepath.Join(root, strconv.FormatUint(ino, 10))
}

// Inode is the inode of the network namespace f refers to.
func Inode(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", f.Name(), err)
	}
	return st.Ino, nil
}

// Open opens the socket map pinned for the netns f, or returns
// (nil, nil) when there is none: the pod is not redirected with eBPF.
func Open(root string, netns *os.File) (*ebpf.Map, error) {
	ino, err := Inode(netns)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(Dir(root, ino), MapFile)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open socket map %s: %w", path, err)
	}
	return m, nil
}

// Register puts the socket c in slot s of m, replacing what the slot held.
func Register(m *ebpf.Map, s Slot, c syscall.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("register %s socket: %w", s, err)
	}
	var uerr error
	if err := raw.Control(func(fd uintptr) {
		uerr = m.Update(uint32(s), uint64(fd), ebpf.UpdateAny)
	}); err != nil {
		return fmt.Errorf("register %s socket: %w", s, err)
	}
	if uerr != nil {
		return fmt.Errorf("register %s socket: %w", s, uerr)
	}
	return nil
}

// Cookie returns the cookie of the socket in slot s, or false when the
// slot is empty.
func Cookie(m *ebpf.Map, s Slot) (uint64, bool, error) {
	var cookie uint64
	err := m.Lookup(uint32(s), &cookie)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("look up %s slot: %w", s, err)
	}
	return cookie, true, nil
}

// SocketCookie returns the kernel's cookie of the socket c (SO_COOKIE),
// which Cookie returns for the slot holding it.
func SocketCookie(c syscall.Conn) (uint64, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("socket cookie: %w", err)
	}
	var cookie uint64
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cookie, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	}); err != nil {
		return 0, fmt.Errorf("socket cookie: %w", err)
	}
	if serr != nil {
		return 0, fmt.Errorf("SO_COOKIE: %w", serr)
	}
	return cookie, nil
}
