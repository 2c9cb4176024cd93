package upstream

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// defaultProcRoot is the proc filesystem PodConfig scans when given none.
const defaultProcRoot = "/proc"

// NetNSIDOf returns the identity of the network namespace f refers to, a
// handle such as the one the CNI agent hands over or an open
// /proc/<pid>/ns/net.
func NetNSIDOf(f *os.File) (NetNSID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return NetNSID{}, fmt.Errorf("stat network namespace %s: %w", f.Name(), err)
	}
	return NetNSID{Dev: st.Dev, Ino: st.Ino}, nil
}

// PodConfig reads and parses the resolv.conf that the processes in the
// network namespace netns see, scanning procRoot ("" means /proc); see
// PodConfigByID.
func PodConfig(procRoot string, netns *os.File) (Config, error) {
	id, err := NetNSIDOf(netns)
	if err != nil {
		return Config{}, err
	}
	return PodConfigByID(procRoot, id)
}

// PodConfigByID reads and parses the resolv.conf that the processes in the
// network namespace id see: it finds the processes under procRoot ("" means
// /proc) whose ns/net is that namespace, in PID order, and returns the first
// etc/resolv.conf, opened under the process's root, that parses with a
// nameserver. A pod's sandbox process has no such file and is passed over;
// the calling process is never taken.
// The open stays inside the process's root and follows no magic link, so
// whatever symlinks the pod made, the file read is one of the pod's. An
// error wraps ErrNoProcess when no process is in the namespace, and
// otherwise the last process's cause.
//
// Another user's process can be inspected only with ptrace read access to
// it (CAP_SYS_PTRACE); the processes that cannot are passed over, and their
// number is in the error when no process was found.
func PodConfigByID(procRoot string, id NetNSID) (Config, error) {
	if procRoot == "" {
		procRoot = defaultProcRoot
	}
	proc, err := os.Open(procRoot)
	if err != nil {
		return Config{}, fmt.Errorf("open proc root: %w", err)
	}
	defer proc.Close()
	names, err := proc.Readdirnames(-1)
	if err != nil {
		return Config{}, fmt.Errorf("list %s: %w", procRoot, err)
	}
	// The reader itself is never the pod: a thread of it that entered the
	// pod's namespace (and Go may run that on the main thread, whose
	// namespace is the one ns/net shows) would make its own root count.
	self, _ := os.Readlink(procRoot + "/self")
	var pids []int
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 && n != self {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)

	procFD := int(proc.Fd())
	tried, denied := 0, 0
	var last, deniedErr error
	for _, pid := range pids {
		if tried == maxCandidates {
			break
		}
		name := strconv.Itoa(pid)
		var st unix.Stat_t
		if err := unix.Fstatat(procFD, name+"/ns/net", &st, 0); err != nil {
			if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
				denied++
				deniedErr = err
			}
			continue
		}
		if !id.names(&st) {
			continue
		}
		tried++
		c, err := readProcess(procFD, name, id)
		if err == nil {
			return c, nil
		}
		last = fmt.Errorf("process %d: %w", pid, err)
	}
	if tried == 0 && denied > 0 {
		// Most likely the reader lacks CAP_SYS_PTRACE: say so rather
		// than only that the namespace looks empty.
		return Config{}, fmt.Errorf("read resolv.conf of netns %v under %s: %w (the namespaces of %d processes were not readable: %w)", id, procRoot, ErrNoProcess, denied, deniedErr)
	}
	if tried == 0 {
		return Config{}, fmt.Errorf("read resolv.conf of netns %v under %s: %w", id, procRoot, ErrNoProcess)
	}
	return Config{}, fmt.Errorf("read resolv.conf of netns %v: no usable file in %d processes: %w", id, tried, last)
}

func (id NetNSID) names(st *unix.Stat_t) bool { return st.Dev == id.Dev && st.Ino == id.Ino }

// readProcess reads etc/resolv.conf under the root of the process whose
// directory is name in procFD.
func readProcess(procFD int, name string, id NetNSID) (Config, error) {
	dir, err := unix.Openat(procFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Config{}, fmt.Errorf("open process directory: %w", err)
	}
	defer unix.Close(dir)
	// The process may have exited since the scan and its PID gone to a
	// process elsewhere; the open directory stays bound to the one
	// process, so the namespace is checked again through it.
	var st unix.Stat_t
	if err := unix.Fstatat(dir, "ns/net", &st, 0); err != nil {
		return Config{}, fmt.Errorf("stat ns/net: %w", err)
	}
	if !id.names(&st) {
		return Config{}, errors.New("process left the network namespace")
	}
	root, err := unix.Openat(dir, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Config{}, fmt.Errorf("open process root: %w", err)
	}
	defer unix.Close(root)
	b, err := readInRoot(root, "etc/resolv.conf")
	if err != nil {
		return Config{}, err
	}
	return Parse(b)
}

// readInRoot reads the regular file name as if root were "/": symlinks,
// absolute ones and "..", resolve inside root (RESOLVE_IN_ROOT), and a magic
// link such as /proc/self/root, which would lead to the reader's own root,
// fails the open (RESOLVE_NO_MAGICLINKS). It reads at most
// MaxResolvConfSize bytes; a larger file is ErrTooLarge. O_NONBLOCK keeps a
// FIFO from holding the open, and anything but a regular file is refused.
func readInRoot(root int, name string) ([]byte, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	var err error
	// EAGAIN: a rename or mount raced the confined lookup, which the
	// kernel refuses to guess through; a repeat usually succeeds.
	for range 3 {
		if fd, err = unix.Openat2(root, name, &how); !errors.Is(err, unix.EAGAIN) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s in root: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file (mode %#o)", name, st.Mode)
	}
	buf := make([]byte, MaxResolvConfSize+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > MaxResolvConfSize {
		return nil, fmt.Errorf("read %s: %w", name, ErrTooLarge)
	}
	return buf[:n], nil
}
