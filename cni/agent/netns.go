package agent

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsFinder locates a running pod's network namespace by its IP, so
// pods that started before the agent (or without the plugin, after a
// node reboot raced the CNI config) can be enrolled: it looks at every
// process's netns under /proc and every pinned netns in the given
// directories.
type netnsFinder struct {
	procRoot string
	pinDirs  []string
}

// find returns the path of a netns holding ip, or "" when none does.
func (f netnsFinder) find(ip netip.Addr) (string, error) {
	seen := map[uint64]bool{}
	var candidates []string
	for _, dir := range f.pinDirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			candidates = append(candidates, filepath.Join(dir, e.Name()))
		}
	}
	entries, err := os.ReadDir(f.procRoot)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", f.procRoot, err)
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			candidates = append(candidates, filepath.Join(f.procRoot, e.Name(), "ns", "net"))
		}
	}
	for _, path := range candidates {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		if holds(path, ip) {
			return path, nil
		}
	}
	return "", nil
}

// holds reports whether the netns at path has ip on an interface.
func holds(path string, ip netip.Addr) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return false
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()))
	if err != nil {
		return false
	}
	defer h.Close()
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := h.AddrList(nil, family)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP); ok && got.Unmap() == ip {
			return true
		}
	}
	return false
}

// inode returns the inode of an open netns handle: two handles to the
// same namespace have the same one.
func inode(f *os.File) uint64 {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0
	}
	return st.Ino
}
