package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
)

// PortGuard keeps every process but the node proxy from binding the
// proxy's ports (bpfprog.GuardedPorts: 15001, 15006, 15008, 15053) inside
// an ambient pod's network namespace (cni/README.md, "The node proxy's
// ports in a pod").
//
// Why: the node proxy opens its in-pod listeners with SO_REUSEPORT so
// that an old and a new proxy can listen side by side during an upgrade.
// The kernel lets any socket of the same user ID with SO_REUSEPORT join
// such a group, and spreads new connections over its members: a root
// process of the pod that binds 15001 or 15006 that way receives a share
// of the pod's redirected traffic, outbound in plaintext and inbound past
// the proxy's authorization. A user ID of the proxy's own does not help
// (a root container has CAP_SETUID and reads it from /proc/net/tcp), a
// reuseport program can be replaced by any member of the group, and
// without SO_REUSEPORT there is no hand-over.
//
// So no process of the pod may join the group at all. Two cgroup
// programs (bind4, bind6; bpfprog.BindGuardSpec) are attached once per
// node to the root of the cgroup2 hierarchy, where they run for every
// process of the node and no pod can detach them (that takes CAP_BPF or
// CAP_SYS_ADMIN and the link). In a network namespace the agent guards
// (Guard: its cookie in a map), they refuse a bind to those ports to any
// task that is not a node proxy registered with Admit, identified by its
// PID namespace and its thread-group ID in it (bpfprog.ProxyID), neither
// of which a pod's process can take. The kernel's own choice of a port
// (listen(), connect() or sendto() on an unbound socket, bind to port 0)
// does not run the bind hook: Guard also reserves the ports in the
// namespace (net.ipv4.ip_local_reserved_ports), so that choice never
// falls on them whatever port range the pod set.
//
// The programs, their maps and links are pinned under Root, so they stay
// attached while no agent runs, and an agent that starts takes them over
// (OpenPortGuard). Its methods are safe for concurrent use.
type PortGuard struct {
	root, cgroup, procRoot string
	log                    *slog.Logger

	guarded, proxies *ebpf.Map
	links            []link.Link

	mu     sync.Mutex
	closed bool
	slots  [bpfprog.ProxySlots]*proxyReg // nil: free
	// owned are the socket inodes the registered proxies held at
	// ownedAt (proxySockets).
	owned   map[uint32]bool
	ownedAt time.Time
}

// proxyReg is a registered node proxy: the slot's ID, and handles on its
// process (watched for its exit) and its PID namespace, held so that the
// namespace, and with it its inode number, outlives the slot.
type proxyReg struct {
	id    bpfprog.ProxyID
	pidfd *os.File
	pidns *os.File
}

// PortGuardConfig configures OpenPortGuard.
type PortGuardConfig struct {
	// Root is the pin directory, on a BPF filesystem; it must not be
	// under the eBPF backend's Root, whose entries are pods.
	Root string
	// Cgroup is the root of the node's cgroup2 hierarchy, or a directory
	// holding it as "unified" (a cgroup v1 node's hybrid layout). It
	// must be the hierarchy's root, not a container's cgroup namespace
	// view: the programs apply to the processes below where they are
	// attached.
	Cgroup string
	// ProcRoot is where the node's processes are seen (default /proc):
	// the agent finds the node proxy's PID namespace and sockets there.
	ProcRoot string
	Log      *slog.Logger
}

// ErrPortTaken is a guarded port of a pod's namespace held by a socket no
// registered node proxy holds: bound before the namespace was guarded,
// listening or still to listen. Such a socket shares the proxy's
// SO_REUSEPORT group, or joins it with listen(), which runs no bind hook,
// so the pod is refused rather than served with it; it goes when the
// process closes it (restarting the pod does). With no node proxy
// registered (an agent that started before any proxy connected, all
// proxies gone) no socket can be told to be a proxy's, and any socket on
// a guarded port is taken: the pod waits for a proxy to register, which
// a fresh pod's namespace, holding no socket, never does.
var ErrPortTaken = errors.New("the node proxy's port is held by a process that is not a registered node proxy")

// Pin names under PortGuardConfig.Root.
const (
	guardNetnsFile   = "guarded"
	guardProxiesFile = "proxies"
	guardLink4File   = "bind4_link"
	guardLink6File   = "bind6_link"
)

// reservedPortsSysctl is net.ipv4.ip_local_reserved_ports, which covers
// both families' automatic port choice; /proc/sys/net shows the namespace
// of the thread that opens it.
const reservedPortsSysctl = "/proc/sys/net/ipv4/ip_local_reserved_ports"

// cgroup2RootID is the inode, and cgroup ID, of a cgroup2 hierarchy's
// root directory.
const cgroup2RootID = 1

// OpenPortGuard attaches the bind guard to the node's cgroup2 root, or
// takes over what an earlier agent pinned under cfg.Root: maps of the
// current layout are kept (with the guarded namespaces and the
// registered proxies in them), a program of another version is swapped
// with Link.Update, which leaves no moment unguarded. Registered proxies
// whose process is gone are forgotten. It then checks, in a throwaway
// network namespace it guards, that the kernel refuses this process a
// bind to a guarded port. Any failure is an error that says what is
// missing: the agent must not enroll ambient pods without the guard.
func OpenPortGuard(cfg PortGuardConfig) (*PortGuard, error) {
	if err := bpfprog.ProbeBindGuard(); err != nil {
		return nil, err
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cgroup, err := cgroup2Root(cfg.Cgroup)
	if err != nil {
		return nil, err
	}
	if err := checkBPFFS(cfg.Root); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.Root, err)
	}
	g := &PortGuard{root: cfg.Root, cgroup: cgroup, procRoot: cfg.ProcRoot, log: cfg.Log.With("component", "port-guard")}
	if err := g.open(); err != nil {
		g.Close()
		return nil, err
	}
	if err := g.selfCheck(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func (g *PortGuard) open() error {
	specs := bpfprog.BindGuardMapSpecs()
	var err error
	if g.guarded, err = openPinnedMap(filepath.Join(g.root, guardNetnsFile), specs[bpfprog.MapGuardedNetns], true); err != nil {
		return err
	}
	if g.proxies, err = openPinnedMap(filepath.Join(g.root, guardProxiesFile), specs[bpfprog.MapProxies], true); err != nil {
		return err
	}
	if err := g.adoptProxies(); err != nil {
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(bpfprog.BindGuardSpec(), ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{bpfprog.MapGuardedNetns: g.guarded, bpfprog.MapProxies: g.proxies},
	})
	if err != nil {
		return fmt.Errorf("load the bind guard: %w", err)
	}
	defer coll.Close() // the links hold the programs
	var ids []ebpf.MapID
	for _, m := range []*ebpf.Map{g.guarded, g.proxies} {
		info, err := m.Info()
		if err != nil {
			return fmt.Errorf("map info: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return errors.New("map info: the kernel reports no map ID")
		}
		ids = append(ids, id)
	}
	for _, l := range []struct {
		name, file string
		attach     ebpf.AttachType
	}{
		{bpfprog.ProgBindGuard4, guardLink4File, ebpf.AttachCGroupInet4Bind},
		{bpfprog.ProgBindGuard6, guardLink6File, ebpf.AttachCGroupInet6Bind},
	} {
		lk, err := g.ensureLink(filepath.Join(g.root, l.file), l.attach, l.name, coll.Programs[l.name], ids)
		if err != nil {
			return err
		}
		g.links = append(g.links, lk)
	}
	return nil
}

// ensureLink makes the link pinned at path attach prog's current version
// to the cgroup2 root, using the pinned maps (ids): kept when it does,
// updated in place when it runs another program, replaced when it is no
// longer attached there.
func (g *PortGuard) ensureLink(path string, attach ebpf.AttachType, name string, prog *ebpf.Program, ids []ebpf.MapID) (link.Link, error) {
	l, err := loadPinnedLink(path)
	if err != nil {
		return nil, err
	}
	if l != nil {
		info, err := l.Info()
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("pinned link %s: %w", path, err)
		}
		if cg := info.Cgroup(); cg != nil && cg.CgroupId == cgroup2RootID {
			cur, err := inspectProg(info.Program, bpfprog.BindGuardSpec().Programs[name], ids)
			if err != nil {
				l.Close()
				return nil, err
			}
			if !cur.ours || !cur.usesMaps {
				if err := l.Update(prog); err != nil {
					l.Close()
					return nil, fmt.Errorf("replace %s with %s: %w", cur, name, err)
				}
			}
			return l, nil
		}
		// Detached, or attached elsewhere: a new one goes in first, so
		// the guard is never off.
		defer func() { _ = dropLink(l) }()
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("unpin stale link %s: %w", path, err)
		}
	}
	nl, err := link.AttachCgroup(link.CgroupOptions{Path: g.cgroup, Attach: attach, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach %s to the cgroup2 root %s: %w", name, g.cgroup, err)
	}
	if err := nl.Pin(path); err != nil {
		nl.Close()
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	return nl, nil
}

// cgroup2Root returns dir, or dir/unified, whichever is a cgroup2
// filesystem's root directory.
func cgroup2Root(dir string) (string, error) {
	for _, d := range []string{dir, filepath.Join(dir, "unified")} {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			continue
		}
		var s unix.Stat_t
		if err := unix.Stat(d, &s); err != nil {
			return "", fmt.Errorf("stat %s: %w", d, err)
		}
		if s.Ino != cgroup2RootID {
			return "", fmt.Errorf("%s is cgroup %d of the cgroup2 hierarchy, not its root (a container's cgroup namespace?): mount the node's /sys/fs/cgroup", d, s.Ino)
		}
		return d, nil
	}
	return "", fmt.Errorf("no cgroup2 hierarchy at %s or %s/unified: the node proxy's ports in pods cannot be guarded", dir, dir)
}

// selfCheck guards a throwaway network namespace and tries to bind a
// guarded port there, of both families, as this process: the kernel must
// refuse it. A process that is itself a registered proxy (a test playing
// both parts) cannot check this way, and skips it.
func (g *PortGuard) selfCheck() error {
	if self, err := identify(g.procRoot, os.Getpid()); err == nil {
		defer self.close()
		g.mu.Lock()
		registered := slices.ContainsFunc(g.slots[:], func(r *proxyReg) bool { return r != nil && r.id == self.id })
		g.mu.Unlock()
		if registered {
			return nil
		}
	}
	errc := make(chan error, 1)
	go func() {
		// The thread never leaves the namespace: it ends with the
		// goroutine, locked.
		runtime.LockOSThread()
		errc <- g.checkInNewNetns()
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("bind guard self-check: %w", err)
	}
	return nil
}

// checkInNewNetns runs on a locked thread, which it moves to a new
// network namespace.
func (g *PortGuard) checkInNewNetns() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("new network namespace: %w", err)
	}
	cookie, err := currentNetnsCookie()
	if err != nil {
		return err
	}
	if err := g.guarded.Update(cookie, bpfprog.GuardedNetns{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("guard a namespace: %w", err)
	}
	defer func() { _ = g.guarded.Delete(cookie) }()
	for _, b := range []struct {
		family int
		sa     unix.Sockaddr
	}{
		{unix.AF_INET, &unix.SockaddrInet4{Port: OutboundPort}},
		{unix.AF_INET6, &unix.SockaddrInet6{Port: InboundPort}},
	} {
		fd, err := unix.Socket(b.family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			continue // a kernel without IPv6: nothing to guard there
		}
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		err = unix.Bind(fd, b.sa)
		unix.Close(fd)
		if !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("a bind to a guarded port by a process that is not a node proxy returned %v, want EPERM", err)
		}
	}
	return nil
}

// currentNetnsCookie is the cookie of the calling thread's network
// namespace (SO_NETNS_COOKIE, Linux 5.14).
func currentNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return v, nil
}

// netnsOf returns the cookie and the inode of the netns at path.
func netnsOf(path string) (cookie, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("stat netns %s: %w", path, err)
	}
	err = netns.Do(path, func() (err error) {
		cookie, err = currentNetnsCookie()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, err)
	}
	return cookie, st.Ino, nil
}

// Guard guards the node proxy's ports in the netns at path: binds there
// are the proxy's alone from now on, and the kernel reserves the ports
// from its automatic choices. It then looks for sockets on them that are
// not a registered proxy's, bound before (a running pod enrolled late),
// and fails with ErrPortTaken if it finds one. It is idempotent.
func (g *PortGuard) Guard(path string) error {
	cookie, ino, err := netnsOf(path)
	if err != nil {
		return err
	}
	if err := g.guarded.Update(cookie, bpfprog.GuardedNetns{Inode: ino}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("guard the node proxy's ports in %s: %w", path, err)
	}
	// Looked at only now: a socket bound from here on is the proxy's.
	st, err := readNetns(path, true)
	if err != nil {
		return err
	}
	taken, err := g.foreignSockets(st.sockets)
	if err != nil {
		return err
	}
	if len(taken) > 0 {
		return fmt.Errorf("%w: %s", ErrPortTaken, strings.Join(taken, ", "))
	}
	return nil
}

// Unguard lets any process of the netns at path bind the node proxy's
// ports again (the pod left the mesh, or became a sidecar pod, whose
// Envoy binds them). The reserved ports stay: an app only loses them as
// automatic choices, and a later Guard needs them. Unguarding a
// namespace not guarded, or gone, succeeds.
func (g *PortGuard) Unguard(path string) error {
	cookie, _, err := netnsOf(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := g.guarded.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unguard %s: %w", path, err)
	}
	return nil
}

// Problems compares the netns at path with what Guard makes of it, when
// want says it should be guarded, or with an unguarded namespace. It
// enters the namespace once.
func (g *PortGuard) Problems(path string, want bool) ([]string, error) {
	st, err := readNetns(path, false)
	if err != nil {
		return nil, err
	}
	var v bpfprog.GuardedNetns
	err = g.guarded.Lookup(st.cookie, &v)
	guarded := err == nil
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("look up %s in the guarded namespaces: %w", path, err)
	}
	if !want {
		if guarded {
			return []string{"the node proxy's ports are guarded, which keeps the pod's own proxy from binding them"}, nil
		}
		return nil, nil
	}
	var problems []string
	if !guarded {
		problems = append(problems, "the node proxy's ports are not guarded: any process of the pod may bind them")
	}
	if missing := unreserved(st.reserved); len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("net.ipv4.ip_local_reserved_ports lacks %s", portList(missing)))
	}
	taken, err := g.foreignSockets(st.sockets)
	if err != nil {
		return nil, err
	}
	for _, s := range taken {
		problems = append(problems, "held by a process that is not a registered node proxy: "+s)
	}
	return problems, nil
}

// netnsState is what Guard and Problems read inside a pod's namespace.
type netnsState struct {
	cookie   uint64
	reserved []portRange
	sockets  []guardedSocket
}

// readNetns reads the netns at path, in one entry; with reserve, it
// first adds the guarded ports to net.ipv4.ip_local_reserved_ports,
// keeping what else is there.
func readNetns(path string, reserve bool) (netnsState, error) {
	var st netnsState
	err := netns.Do(path, func() (err error) {
		if st.cookie, err = currentNetnsCookie(); err != nil {
			return err
		}
		if st.reserved, err = readReservedPorts(); err != nil {
			return fmt.Errorf("read net.ipv4.ip_local_reserved_ports: %w", err)
		}
		if missing := unreserved(st.reserved); reserve && len(missing) > 0 {
			for _, p := range missing {
				st.reserved = append(st.reserved, portRange{p, p})
			}
			if err := os.WriteFile(reservedPortsSysctl, []byte(formatPortRanges(st.reserved)), 0o644); err != nil {
				return fmt.Errorf("reserve the node proxy's ports: %w", err)
			}
		}
		st.sockets, err = listGuardedSockets()
		return err
	})
	if err != nil {
		return st, fmt.Errorf("netns %s: %w", path, err)
	}
	return st, nil
}

// Prune forgets the guarded namespaces whose inode is not in live: pods
// that went away while no agent ran, whose Unguard never came (a cookie
// is never reused, so such an entry guards nothing; pruning keeps the map
// from filling), and live namespaces the caller holds no pod in (one
// whose enrollment failed after Guard, which no proxy serves, guarded
// again when it is tried again). An inode reused by a live namespace
// keeps the entry, which is harmless. live must hold every namespace the caller has
// a pod in and every one it is guarding (an enrollment under way, whose
// pod the caller does not count yet), and no Guard may start between the
// caller's reading of them and Prune's return: an entry left out guards a
// live pod, and forgetting it lets the pod's processes bind the proxy's
// ports (the agent holds its enrollments off while it prunes,
// agent.collectPins).
func (g *PortGuard) Prune(live []uint64) (int, error) {
	var (
		key     uint64
		val     bpfprog.GuardedNetns
		stale   []uint64
		entries = g.guarded.Iterate()
	)
	for entries.Next(&key, &val) {
		if !slices.Contains(live, val.Inode) {
			stale = append(stale, key)
		}
	}
	if err := entries.Err(); err != nil {
		return 0, fmt.Errorf("list the guarded namespaces: %w", err)
	}
	n := 0
	for _, k := range stale {
		if err := g.guarded.Delete(k); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("forget a guarded namespace: %w", err)
		}
	}
	return n, nil
}

// Admit registers the process pid (as the agent sees it: the peer of the
// node proxy's ZDS connection, SO_PEERCRED) as a node proxy: it may bind
// the guarded ports from now on, until it exits. Registering the same
// process again changes nothing. The agent must see the node's processes
// (hostPID): a pid it cannot see is refused.
func (g *PortGuard) Admit(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("node proxy pid %d: the proxy's process is not visible from the agent's PID namespace (run the agent with hostPID)", pid)
	}
	reg, err := identify(g.procRoot, pid)
	if err != nil {
		return fmt.Errorf("node proxy pid %d: %w", pid, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		reg.close()
		return errors.New("port guard closed")
	}
	free := -1
	for i, r := range g.slots {
		switch {
		case r != nil && r.id == reg.id:
			reg.close()
			return nil
		case r == nil && free < 0:
			free = i
		}
	}
	if free < 0 {
		reg.close()
		return fmt.Errorf("node proxy pid %d: all %d proxy slots are taken by live node proxies", pid, bpfprog.ProxySlots)
	}
	if err := g.proxies.Update(uint32(free), reg.id, ebpf.UpdateAny); err != nil {
		reg.close()
		return fmt.Errorf("register node proxy pid %d: %w", pid, err)
	}
	g.slots[free] = reg
	g.owned = nil
	go g.watch(free, reg)
	g.log.Info("node proxy may bind its ports in guarded pods", "pid", pid, "slot", free)
	return nil
}

// watch frees slot i when reg's process exits. The kernel reports the
// exit (the pidfd turns readable) before the process's PID can be given
// to another, and the PID namespace handle keeps the namespace's inode
// from being reused while the slot names it.
func (g *PortGuard) watch(i int, reg *proxyReg) {
	raw, err := reg.pidfd.SyscallConn()
	if err == nil {
		waited := false
		err = raw.Read(func(uintptr) bool {
			if waited {
				return true
			}
			waited = true
			return false
		})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.slots[i] != reg {
		return
	}
	if err != nil {
		// The watch cannot go on: keep the slot rather than lose a
		// live proxy's registration; a later Admit of the same
		// process finds it.
		g.log.Warn("cannot watch a node proxy's process", "pid", reg.id.HostPID, "err", err)
		return
	}
	if err := g.proxies.Update(uint32(i), bpfprog.ProxyID{}, ebpf.UpdateAny); err != nil {
		g.log.Error("cannot forget a node proxy that exited", "pid", reg.id.HostPID, "err", err)
		return
	}
	g.slots[i] = nil
	g.owned = nil
	reg.close()
	g.log.Info("node proxy exited; its slot is free", "pid", reg.id.HostPID, "slot", i)
}

// adoptProxies takes over the proxies an earlier agent registered: each
// slot whose process still runs, with the same PID namespace and ID, is
// watched as if Admit had registered it; the others are cleared.
func (g *PortGuard) adoptProxies() error {
	for i := range bpfprog.ProxySlots {
		var id bpfprog.ProxyID
		if err := g.proxies.Lookup(uint32(i), &id); err != nil {
			return fmt.Errorf("read proxy slot %d: %w", i, err)
		}
		if id.PidnsIno == 0 {
			continue
		}
		reg, err := identify(g.procRoot, int(id.HostPID))
		if err == nil && reg.id == id {
			g.slots[i] = reg
			go g.watch(i, reg)
			continue
		}
		if reg != nil {
			reg.close()
		}
		if err := g.proxies.Update(uint32(i), bpfprog.ProxyID{}, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("clear proxy slot %d: %w", i, err)
		}
	}
	return nil
}

// identify opens pid's process and PID namespace and reads its ProxyID.
// It checks after reading that the process the pidfd holds still runs,
// so what was read under /proc/<pid> was that process's and not a
// successor's with the same PID.
func identify(procRoot string, pid int) (*proxyReg, error) {
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	reg := &proxyReg{pidfd: os.NewFile(uintptr(pidfd), fmt.Sprintf("pidfd:%d", pid))}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if reg.pidns, err = os.Open(filepath.Join(dir, "ns", "pid")); err != nil {
		reg.close()
		return nil, fmt.Errorf("open its PID namespace: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(reg.pidns.Fd()), &st); err != nil {
		reg.close()
		return nil, fmt.Errorf("stat its PID namespace: %w", err)
	}
	tgid, err := innermostTgid(filepath.Join(dir, "status"))
	if err != nil {
		reg.close()
		return nil, err
	}
	start, err := startTime(filepath.Join(dir, "stat"))
	if err != nil {
		reg.close()
		return nil, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		reg.close()
		return nil, fmt.Errorf("the process is gone: %w", err)
	}
	reg.id = bpfprog.ProxyID{
		// The kernel compares the namespace's device as its own dev_t
		// encoding (MKDEV: 12-bit major, 20-bit minor), not stat's.
		PidnsDev:  uint64(unix.Major(st.Dev))<<20 | uint64(unix.Minor(st.Dev)),
		PidnsIno:  st.Ino,
		Tgid:      tgid,
		HostPID:   uint32(pid),
		StartTime: start,
	}
	return reg, nil
}

// startTime reads when a process started, in clock ticks after boot
// (field 22 of /proc/<pid>/stat): with its PID, what names one process
// for the node's whole uptime, so that an agent that starts adopts a
// registration only for the process it was made for, not for another
// given the same PID meanwhile.
func startTime(stat string) (uint64, error) {
	b, err := os.ReadFile(stat)
	if err != nil {
		return 0, fmt.Errorf("read its stat: %w", err)
	}
	// The command name, field 2, is in parentheses and may hold spaces
	// and parentheses itself; the fields after the last ')' start at 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", stat)
	}
	f := strings.Fields(string(b[i+1:]))
	const field = 22 - 3
	if len(f) <= field {
		return 0, fmt.Errorf("%s: %d fields after the command name", stat, len(f))
	}
	v, err := strconv.ParseUint(f[field], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: start time: %w", stat, err)
	}
	return v, nil
}

// innermostTgid reads a process's thread-group ID in its own PID
// namespace: the last field of NSpid in /proc/<pid>/status (the process
// is its thread group's leader, so its PID is the group's).
func innermostTgid(status string) (uint32, error) {
	b, err := os.ReadFile(status)
	if err != nil {
		return 0, fmt.Errorf("read its status: %w", err)
	}
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			break
		}
		v, err := strconv.ParseUint(f[len(f)-1], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("NSpid in %s: %w", status, err)
		}
		return uint32(v), nil
	}
	return 0, fmt.Errorf("no NSpid in %s", status)
}

func (r *proxyReg) close() {
	if r.pidfd != nil {
		r.pidfd.Close()
	}
	if r.pidns != nil {
		r.pidns.Close()
	}
}

// Close releases the agent's handles. What is pinned stays attached,
// with the registered proxies, for the next agent; Remove takes it away.
func (g *PortGuard) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	slots := g.slots
	g.slots = [bpfprog.ProxySlots]*proxyReg{}
	g.mu.Unlock()
	for _, r := range slots {
		if r != nil {
			r.close()
		}
	}
	for _, l := range g.links {
		l.Close()
	}
	for _, m := range []*ebpf.Map{g.guarded, g.proxies} {
		if m != nil {
			m.Close()
		}
	}
}

// Remove detaches the guard from the node and removes its pins: for an
// agent uninstalled from the node, once no pod is enrolled. The
// PortGuard is closed.
func (g *PortGuard) Remove() error {
	g.Close()
	return removePinDir(g.root)
}

// unreserved lists the guarded ports reserved lacks.
func unreserved(reserved []portRange) []uint16 {
	var missing []uint16
	for _, p := range bpfprog.GuardedPorts() {
		if !slices.ContainsFunc(reserved, func(r portRange) bool { return r.has(p) }) {
			missing = append(missing, p)
		}
	}
	return missing
}

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi uint16 }

func (r portRange) has(p uint16) bool { return r.lo <= p && p <= r.hi }

// readReservedPorts reads net.ipv4.ip_local_reserved_ports in the calling
// thread's namespace.
func readReservedPorts() ([]portRange, error) {
	b, err := os.ReadFile(reservedPortsSysctl)
	if err != nil {
		return nil, err
	}
	return parsePortRanges(string(b))
}

// parsePortRanges parses the sysctl's "8080,9000-9010" form.
func parsePortRanges(s string) ([]portRange, error) {
	var out []portRange
	for _, f := range strings.Split(strings.TrimSpace(s), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		if !isRange {
			hi = lo
		}
		l, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("reserved ports %q: %w", s, err)
		}
		h, err := strconv.ParseUint(hi, 10, 16)
		if err != nil || h < l {
			return nil, fmt.Errorf("reserved ports %q: bad range %q", s, f)
		}
		out = append(out, portRange{uint16(l), uint16(h)})
	}
	return out, nil
}

func formatPortRanges(rs []portRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(int(r.lo))
		if r.hi != r.lo {
			parts[i] += "-" + strconv.Itoa(int(r.hi))
		}
	}
	return strings.Join(parts, ",")
}

func portList(ps []uint16) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = strconv.Itoa(int(p))
	}
	return strings.Join(parts, ",")
}

// guardedSocket is a socket on a guarded port of a pod's namespace that
// takes new connections or datagrams, or may: a TCP listener, a TCP
// socket bound and not connected (listen() makes it one of the group
// without a bind), or a UDP socket.
type guardedSocket struct {
	proto string
	port  uint16
	inode uint32
}

func (s guardedSocket) String() string {
	return fmt.Sprintf("%s port %d (socket inode %d)", s.proto, s.port, s.inode)
}

// foreignSockets returns those of found that no registered proxy holds.
// A proxy's sockets are told by its file descriptors (/proc/<pid>/fd);
// with no proxy registered there is no telling them from others, and all
// are returned: what cannot be told a proxy's is not verified.
func (g *PortGuard) foreignSockets(found []guardedSocket) ([]string, error) {
	if len(found) == 0 {
		return nil, nil
	}
	var out []string
	for rescanned := false; ; rescanned = true {
		owned, ok, err := g.proxySockets(rescanned)
		if err != nil {
			return nil, err
		}
		if !ok {
			for _, s := range found {
				out = append(out, s.String()+", and no node proxy is registered to tell whose")
			}
			return out, nil
		}
		out = out[:0]
		for _, s := range found {
			if !owned[s.inode] {
				out = append(out, s.String())
			}
		}
		if len(out) == 0 || rescanned {
			return out, nil
		}
	}
}

// ownedTTL bounds how long a scan of the proxies' descriptors answers: a
// socket's inode number is reused only after the node made 2^32 others,
// but an entry for a socket the proxy closed has no reason to stay.
const ownedTTL = time.Minute

// proxySockets returns the socket inodes the registered proxies hold,
// from the last scan unless it is older than ownedTTL or rescan asks
// for a new one (a socket the last one did not see: listeners are
// long-lived, so a scan serves many pods' checks). ok is false with no
// proxy registered.
func (g *PortGuard) proxySockets(rescan bool) (owned map[uint32]bool, ok bool, err error) {
	g.mu.Lock()
	var pids []uint32
	for _, r := range g.slots {
		if r != nil {
			pids = append(pids, r.id.HostPID)
		}
	}
	cached, at := g.owned, g.ownedAt
	g.mu.Unlock()
	if len(pids) == 0 {
		return nil, false, nil
	}
	if !rescan && cached != nil && time.Since(at) < ownedTTL {
		return cached, true, nil
	}
	owned = map[uint32]bool{}
	for _, pid := range pids {
		if err := socketInodes(filepath.Join(g.procRoot, strconv.Itoa(int(pid)), "fd"), owned); err != nil {
			return nil, false, err
		}
	}
	g.mu.Lock()
	g.owned, g.ownedAt = owned, time.Now()
	g.mu.Unlock()
	return owned, true, nil
}

// listGuardedSockets lists the calling thread's namespace's sockets on
// guarded ports, of both families, that are or may become part of the
// proxy's SO_REUSEPORT group: TCP listeners, TCP sockets bound and
// neither listening nor connected (listen() joins them to the group
// later, with no bind; listGuardedTCP), UDP sockets. A TCP
// connection (an accepted one, the proxy's) can never listen, and is left
// out: the proxy closes them all the time, and one closed between this
// list and the scan of its descriptors would look foreign. A socket
// without an inode (a connection in a listener's queue, one closed) is no
// process's.
func listGuardedSockets() ([]guardedSocket, error) {
	ports := bpfprog.GuardedPorts()
	var out []guardedSocket
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		tcp, err := listGuardedTCP(fam)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EAFNOSUPPORT) {
			continue // no such family here
		}
		if err != nil {
			return nil, err
		}
		out = append(out, tcp...)
		udp, err := netlink.SocketDiagUDP(fam)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EAFNOSUPPORT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sock_diag udp: %w", err)
		}
		for _, s := range udp {
			if s.INode != 0 && slices.Contains(ports, s.ID.SourcePort) {
				out = append(out, guardedSocket{proto: "udp", port: s.ID.SourcePort, inode: s.INode})
			}
		}
	}
	return out, nil
}

// socketInodes adds the socket inodes among the descriptors in fdDir to
// into. A process that is gone holds nothing.
func socketInodes(fdDir string, into map[uint32]bool) error {
	entries, err := os.ReadDir(fdDir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", fdDir, err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		rest, ok := strings.CutPrefix(target, "socket:[")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 32); err == nil {
			into[uint32(v)] = true
		}
	}
	return nil
}
