package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// How the agent finds a pod's network namespace, by the pod's identity:
//
//  1. The path the container runtime gave at the pod's CNI ADD, recorded
//     on the node (record.go) so that it outlives an agent restart, and
//     trusted only while it still names the namespace it named then.
//  2. For a pod whose ADD the agent never saw (started before the agent,
//     or while the plugin was missing from the CNI chain), the namespace of
//     the pod's processes: Kubernetes runs every container of a pod in a
//     cgroup whose path carries the pod's UID, which a pod cannot change.
//
// The pod's IP is then checked in the namespace found, but it never picks
// one: any pod with NET_ADMIN can put another pod's IP on its own loopback,
// and would be served by the node proxy under that pod's identity.

// netnsFinder finds pods' network namespaces among the node's processes.
type netnsFinder struct {
	procRoot string
}

// nsRef is a network namespace some process of a pod lives in: the path
// it was seen at and the namespace's identity.
type nsRef struct {
	path     string
	dev, ino uint64
}

// podNamespaces maps pod UIDs to the network namespaces of their
// processes.
type podNamespaces map[types.UID][]nsRef

// scan reads every process's cgroup under procRoot once.
func (f netnsFinder) scan() (podNamespaces, error) {
	entries, err := os.ReadDir(f.procRoot)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.procRoot, err)
	}
	out := podNamespaces{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(f.procRoot, e.Name(), "cgroup"))
		if err != nil {
			continue // gone
		}
		uid, ok := podUIDFromCgroup(string(b))
		if !ok {
			continue
		}
		path := filepath.Join(f.procRoot, e.Name(), "ns", "net")
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			continue
		}
		ref := nsRef{path: path, dev: st.Dev, ino: st.Ino}
		if !containsNs(out[uid], ref) {
			out[uid] = append(out[uid], ref)
		}
	}
	return out, nil
}

func containsNs(refs []nsRef, r nsRef) bool {
	for _, x := range refs {
		if x.dev == r.dev && x.ino == r.ino {
			return true
		}
	}
	return false
}

// errNoNetns: no namespace of the pod's own holds its IP.
var errNoNetns = errors.New("no network namespace found")

// open returns a handle on the one namespace among refs that holds ip.
// None, or more than one, is an error: the pod's own processes disagree
// about where it lives.
func open(refs []nsRef, ip netip.Addr) (*os.File, error) {
	var found []*os.File
	for _, r := range refs {
		f, err := openIdentified(r.path, r.dev, r.ino)
		if err != nil {
			continue // the process is gone
		}
		if holdsFd(f, ip) {
			found = append(found, f)
		} else {
			f.Close()
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		if len(refs) == 0 {
			return nil, fmt.Errorf("%w: no process of the pod runs on this node", errNoNetns)
		}
		return nil, fmt.Errorf("%w: none of the %d network namespaces of the pod's processes holds its IP %s", errNoNetns, len(refs), ip)
	default:
		for _, f := range found {
			f.Close()
		}
		return nil, fmt.Errorf("%w: %d network namespaces of the pod's processes hold its IP %s", errNoNetns, len(found), ip)
	}
}

// openIdentified opens the network namespace at path if it is still the
// one identified by dev and ino (the path may since name another: a
// reused PID, a recreated pin).
func openIdentified(path string, dev, ino uint64) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Dev != dev || st.Ino != ino {
		f.Close()
		return nil, fmt.Errorf("%s names another network namespace now", path)
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		f.Close()
		return nil, fmt.Errorf("%s is not a network namespace", path)
	}
	return f, nil
}

// podUIDFromCgroup returns the UID of the pod a process belongs to, from
// its /proc/<pid>/cgroup, and whether it belongs to one. Only the cgroup
// v2 line and the v1 lines of real controllers count: a v1 named hierarchy
// ("name=...") can be made up by a process with CAP_SYS_ADMIN. Lines that
// name different pods make the answer "none".
func podUIDFromCgroup(content string) (types.UID, bool) {
	var found types.UID
	for _, line := range strings.Split(content, "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		controllers, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		unified := id == "0" && controllers == ""
		if !unified && (controllers == "" || strings.HasPrefix(controllers, "name=")) {
			continue
		}
		uid, ok := podUIDFromPath(path)
		if !ok {
			continue
		}
		if found != "" && found != uid {
			return "", false
		}
		found = uid
	}
	return found, found != ""
}

// podUIDFromPath finds the pod's cgroup in a cgroup path as the kubelet
// names it: with the cgroupfs driver /kubepods[/<qos>]/pod<uid>/..., with
// the systemd driver /kubepods.slice/.../kubepods[-<qos>]-pod<uid with _>.slice/....
// Only the outermost pod cgroup counts: below it, a pod with delegated
// cgroups could name its own.
func podUIDFromPath(path string) (types.UID, bool) {
	underKubepods := false
	for _, c := range strings.Split(path, "/") {
		if c == "kubepods" || strings.HasPrefix(c, "kubepods-") || strings.HasPrefix(c, "kubepods.") {
			if rest, ok := strings.CutSuffix(c, ".slice"); ok {
				if i := strings.LastIndex(rest, "-pod"); i >= 0 {
					uid := strings.ReplaceAll(rest[i+len("-pod"):], "_", "-")
					return types.UID(uid), isUID(uid)
				}
			}
			underKubepods = true
			continue
		}
		if underKubepods {
			if uid, ok := strings.CutPrefix(c, "pod"); ok {
				return types.UID(uid), isUID(uid)
			}
		}
	}
	return "", false
}

// isUID reports whether s is a Kubernetes object UID (a UUID in its
// canonical lower-case form).
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// holdsFd reports whether the netns f is a handle on has ip on an
// interface.
func holdsFd(f *os.File, ip netip.Addr) bool {
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

// identity returns the device and inode of an open netns handle: two
// handles on the same namespace have the same ones.
func identity(f *os.File) (dev, ino uint64) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0
	}
	return st.Dev, st.Ino
}
