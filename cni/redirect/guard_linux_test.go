package redirect

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// openGuard attaches a PortGuard, pinned in a private BPF filesystem, to
// the node's cgroup2 root, as the agent does. Its programs act only in
// the namespaces it guards (its own map), so other tests of the machine
// are not concerned.
func openGuard(t *testing.T) *PortGuard {
	t.Helper()
	nettest.NeedRoot(t)
	if err := bpfprog.ProbeBindGuard(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	cg := cgroupMount(t)
	g, err := OpenPortGuard(PortGuardConfig{Root: filepath.Join(nettest.BPFFS(t), "guard"), Cgroup: cg, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// cgroupMount finds the node's cgroup2 hierarchy.
func cgroupMount(t *testing.T) string {
	t.Helper()
	for _, d := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := cgroup2Root(d); err == nil {
			return d
		}
	}
	ci.Unavailable(t, "no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")
	return ""
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// bindIn binds a TCP socket to port in the netns at path, as this
// process, and returns the error.
func bindIn(t *testing.T, path string, family int, port int) error {
	t.Helper()
	var berr error
	err := netns.Do(path, func() error {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port}
		if family == unix.AF_INET6 {
			sa = &unix.SockaddrInet6{Port: port}
		}
		berr = unix.Bind(fd, sa)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return berr
}

// TestPortGuardDecides: in a guarded namespace only a registered proxy
// binds the guarded ports, of both families; other ports, and other
// namespaces, are anyone's; Unguard gives the ports back.
func TestPortGuardDecides(t *testing.T) {
	g := openGuard(t)
	p := newPair(t)
	other := newPair(t)
	if err := g.Guard(p.pod); err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{OutboundPort, InboundPort, HBONEPort, DNSPort} {
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			if err := bindIn(t, p.pod, fam, port); !errors.Is(err, unix.EPERM) {
				t.Errorf("unregistered bind to %d (family %d) in a guarded netns: %v, want EPERM", port, fam, err)
			}
			if err := bindIn(t, other.pod, fam, port); err != nil {
				t.Errorf("bind to %d (family %d) in a netns not guarded: %v", port, fam, err)
			}
		}
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, 8080); err != nil {
		t.Errorf("bind to 8080 in a guarded netns: %v", err)
	}
	if err := g.Admit(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, OutboundPort); err != nil {
		t.Errorf("the registered proxy's bind: %v", err)
	}
	if err := g.Unguard(p.pod); err != nil {
		t.Fatal(err)
	}
	problems, err := g.Problems(p.pod, false)
	if err != nil || len(problems) > 0 {
		t.Errorf("Problems of an unguarded netns = %v, %v", problems, err)
	}
}

// The attack, and a second node proxy, run in processes of their own:
// the guard tells the node proxy by its process, and this test's process
// is the node proxy. TestMain runs such a process's part when the test
// binary is started with roleEnv set (startRole).
const (
	roleEnv      = "CANOPY_GUARD_TEST_ROLE"
	roleNetnsEnv = "CANOPY_GUARD_TEST_NETNS"
	roleSpecEnv  = "CANOPY_GUARD_TEST_SPEC"
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		os.Exit(runRole())
	}
	os.Exit(m.Run())
}

// roleSpec is what a role process does in the pod's namespace.
type roleSpec struct {
	// DropCaps leaves the binding thread the capabilities a container
	// runtime gives a root container by default: no CAP_NET_ADMIN,
	// CAP_SYS_ADMIN or CAP_BPF, but CAP_SETUID, CAP_NET_RAW and
	// CAP_SYS_CHROOT.
	DropCaps bool
	// Binds are sockets bound with SO_REUSEPORT, as the node proxy's
	// are (and as the same user): "tcp [::]:15001", "udp 0.0.0.0:15053".
	// A TCP socket that binds listens and accepts, a UDP one reads.
	Binds []string
	// WaitToBind waits for a line on stdin before binding: time for
	// the test to register the process as a node proxy.
	WaitToBind bool
	// Autobinds lets the kernel pick a port this many times for each
	// of a TCP listener and a UDP socket (listen() and sendto() on
	// unbound sockets, with SO_REUSEPORT), keeping every socket open.
	Autobinds int
}

// roleReady is what a role process reports once its sockets are open.
type roleReady struct {
	// Caps are the binding thread's effective capabilities.
	Caps uint64
	// Binds are the errors of Binds, "" for a bind that succeeded.
	Binds []string
	// Autobound are the ports the kernel picked.
	Autobound []int
}

// roleCounts is what a role process reports when its stdin closes: what
// each bound socket received (connections accepted, datagrams read).
type roleCounts struct {
	Received []int
}

// containerCaps are the capabilities containerd and Docker give a
// container by default.
const containerCaps = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FSETID | 1<<unix.CAP_FOWNER |
	1<<unix.CAP_MKNOD | 1<<unix.CAP_NET_RAW | 1<<unix.CAP_SETGID | 1<<unix.CAP_SETUID | 1<<unix.CAP_SETFCAP |
	1<<unix.CAP_SETPCAP | 1<<unix.CAP_NET_BIND_SERVICE | 1<<unix.CAP_SYS_CHROOT | 1<<unix.CAP_KILL | 1<<unix.CAP_AUDIT_WRITE

// runRole is a role process's main: its binds and autobinds run on one
// thread, moved into the pod's namespace and, with DropCaps, left with a
// container's capabilities (capabilities are a thread's: the kernel
// checks the caller's).
func runRole() int {
	var spec roleSpec
	if err := json.Unmarshal([]byte(os.Getenv(roleSpecEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	type result struct {
		ready roleReady
		recv  []func() int
		err   error
	}
	if spec.WaitToBind {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the process
		var r result
		r.ready, r.recv, r.err = roleSockets(spec)
		done <- r
	}()
	r := <-done
	if r.err != nil {
		fmt.Fprintln(os.Stderr, r.err)
		return 2
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(r.ready); err != nil {
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	time.Sleep(100 * time.Millisecond) // the last connections' accepts
	var c roleCounts
	for _, f := range r.recv {
		c.Received = append(c.Received, f())
	}
	if err := out.Encode(c); err != nil {
		return 2
	}
	return 0
}

func roleSockets(spec roleSpec) (roleReady, []func() int, error) {
	var ready roleReady
	ns, err := os.Open(os.Getenv(roleNetnsEnv))
	if err != nil {
		return ready, nil, err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return ready, nil, fmt.Errorf("setns: %w", err)
	}
	if spec.DropCaps {
		for c := 0; c <= unix.CAP_LAST_CAP; c++ {
			if containerCaps&(1<<c) == 0 {
				if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					return ready, nil, fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
				}
			}
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		data := [2]unix.CapUserData{
			{Effective: containerCaps, Permitted: containerCaps},
			{},
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return ready, nil, fmt.Errorf("capset: %w", err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return ready, nil, fmt.Errorf("capget: %w", err)
	}
	ready.Caps = uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
	var recv []func() int
	for _, b := range spec.Binds {
		proto, addr, _ := strings.Cut(b, " ")
		count, err := reusePortSocket(proto, netip.MustParseAddrPort(addr))
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		ready.Binds = append(ready.Binds, msg)
		recv = append(recv, count)
	}
	for range spec.Autobinds {
		for _, proto := range []string{"tcp", "udp"} {
			port, err := autobind(proto)
			if err != nil {
				return ready, nil, err
			}
			ready.Autobound = append(ready.Autobound, port)
		}
	}
	return ready, recv, nil
}

// reusePortSocket binds a socket with SO_REUSEPORT (IPv6 ones for both
// families) and, when it binds, counts what it receives; a failed bind
// counts nothing.
func reusePortSocket(proto string, ap netip.AddrPort) (func() int, error) {
	zero := func() int { return 0 }
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	typ := unix.SOCK_STREAM
	if proto == "udp" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return zero, err
	}
	// Everything the proxy's sockets have that CAP_NET_RAW gets: its
	// mark, with which the pod's rules let its packets leave, and
	// IP_TRANSPARENT, with which the eBPF backend's outbound
	// connections, to addresses the pod does not own, complete.
	opts := []struct{ level, opt, v int }{
		{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1},
		{unix.SOL_SOCKET, unix.SO_MARK, ProxyMark},
		{unix.SOL_IP, unix.IP_TRANSPARENT, 1},
	}
	if family == unix.AF_INET6 {
		opts = append(opts, struct{ level, opt, v int }{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0},
			struct{ level, opt, v int }{unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1})
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			unix.Close(fd)
			return zero, fmt.Errorf("setsockopt %d: %w", o.opt, err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return zero, err
	}
	f := os.NewFile(uintptr(fd), "role")
	defer f.Close()
	n := make(chan int, 1)
	n <- 0
	add := func() { n <- <-n + 1 }
	if proto == "udp" {
		c, err := net.FilePacketConn(f)
		if err != nil {
			return zero, err
		}
		go func() {
			buf := make([]byte, 512)
			for {
				if _, _, err := c.ReadFrom(buf); err != nil {
					return
				}
				add()
			}
		}()
		return func() int { return <-n }, nil
	}
	if err := unix.Listen(fd, 128); err != nil {
		return zero, err
	}
	l, err := net.FileListener(f)
	if err != nil {
		return zero, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			add()
			c.Close()
		}
	}()
	return func() int { return <-n }, nil
}

// autobind lets the kernel pick a port for a socket with SO_REUSEPORT:
// listen() on an unbound TCP socket, sendto() on an unbound UDP one. The
// socket stays open, so the next pick is another port.
func autobind(proto string) (int, error) {
	typ := unix.SOCK_STREAM
	if proto == "udp" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return 0, err
	}
	if proto == "udp" {
		err = unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}})
	} else {
		err = unix.Listen(fd, 1)
	}
	if err != nil {
		return 0, fmt.Errorf("%s autobind: %w", proto, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, err
	}
	return sa.(*unix.SockaddrInet4).Port, nil
}

// role is a running role process.
type role struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *json.Decoder
	ready roleReady
}

// startRole starts a role process in the netns at path, in a PID
// namespace of its own when ownPidns (as a pod's processes are), and
// waits until its sockets are open.
func startRole(t *testing.T, path string, ownPidns bool, spec roleSpec) *role {
	t.Helper()
	return startRoleAdmitted(t, path, ownPidns, spec, nil)
}

// startRoleAdmitted is startRole for a process that waits to bind
// (spec.WaitToBind) until admit, given its PID as this process sees it,
// returns.
func startRoleAdmitted(t *testing.T, path string, ownPidns bool, spec roleSpec, admit func(pid int)) *role {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=1", roleNetnsEnv+"="+path, roleSpecEnv+"="+string(b))
	cmd.Stderr = tWriter{t}
	if ownPidns {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &role{cmd: cmd, stdin: stdin, out: json.NewDecoder(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if spec.WaitToBind {
		if admit != nil {
			admit(cmd.Process.Pid)
		}
		if _, err := io.WriteString(stdin, "bind\n"); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.out.Decode(&r.ready); err != nil {
		t.Fatalf("role process: %v", err)
	}
	return r
}

// counts ends the role process and returns what its sockets received.
func (r *role) counts(t *testing.T) []int {
	t.Helper()
	r.stdin.Close()
	var c roleCounts
	if err := r.out.Decode(&c); err != nil {
		t.Fatalf("role process counts: %v", err)
	}
	return c.Received
}

// proxyListen listens on [::]:port in the pod as the node proxy does
// (node/inpod): SO_REUSEPORT, both families, marked, transparent when
// asked (the eBPF backend's 15001), plain TCP.
func proxyReusePort(t *testing.T, pod string, port int, transparent bool) (listener, *net.TCPListener) {
	t.Helper()
	l := in(t, pod, func() (*net.TCPListener, error) {
		lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
			if err := sockopts(transparent)(network, address, c); err != nil {
				return err
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				if serr == nil {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
				}
			})
			return errors.Join(err, serr)
		}}
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(context.Background(), "tcp6", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			return nil, err
		}
		return l.(*net.TCPListener), nil
	})
	t.Cleanup(func() { l.Close() })
	return acceptAll(l), l
}

// drain counts what l has accepted until nothing more comes for a
// moment.
func drain(l listener) int {
	n := 0
	for {
		select {
		case c := <-l:
			c.Close()
			n++
		case <-time.After(200 * time.Millisecond):
			return n
		}
	}
}

// setPortRange writes net.ipv4.ip_local_port_range in the netns at path.
func setPortRange(t *testing.T, path, r string) {
	t.Helper()
	in(t, path, func() (struct{}, error) {
		return struct{}{}, os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(r), 0o644)
	})
}

// attackConns is how many connections each direction of the attack test
// sends.
const attackConns = 32

// TestAttackerInPodGetsNoProxyConnection is the attack: a root process
// in an enrolled pod's network namespace, with a container's
// capabilities (CAP_SETUID, CAP_NET_RAW, CAP_SYS_CHROOT, no
// CAP_NET_ADMIN), the node proxy's user ID (0) and SO_REUSEPORT, binds the
// proxy's ports to join its listeners' groups, and counts the pod's
// redirected connections it receives out of attackConns in each
// direction. Before the guard, its binds succeeded and it took a share
// of both (the finding measured 14 of 32 inbound, 13 of 32 outbound);
// now every bind fails with EPERM and it receives nothing, with each
// backend, whether the process has a PID namespace of its own (a pod's)
// or the node's (a hostPID pod's). It also lets the kernel pick ports
// for it with the pod's port range narrowed to the proxy's ports (a
// pod's net.ipv4.ip_local_port_range sysctl): it never gets one.
func TestAttackerInPodGetsNoProxyConnection(t *testing.T) {
	type setup struct {
		pod, out      string
		outDst, inDst string
	}
	backends := []struct {
		name string
		b    func(t *testing.T) (Backend, setup, func(t *testing.T) (outbound, inbound listener))
	}{
		{"nftables", func(t *testing.T) (Backend, setup, func(*testing.T) (listener, listener)) {
			p := newPair(t)
			return Nftables{}, setup{p.pod, p.out, "10.213.0.1:80", "10.213.0.2:8080"}, func(t *testing.T) (listener, listener) {
				o, _ := proxyReusePort(t, p.pod, OutboundPort, false)
				i, _ := proxyReusePort(t, p.pod, InboundPort, false)
				return o, i
			}
		}},
		{"iptables", func(t *testing.T) (Backend, setup, func(*testing.T) (listener, listener)) {
			if _, err := exec.LookPath("iptables-restore"); err != nil {
				ci.Unavailable(t, "no iptables-restore (Debian package iptables)")
			}
			p := newPair(t)
			return Iptables{}, setup{p.pod, p.out, "10.213.0.1:80", "10.213.0.2:8080"}, func(t *testing.T) (listener, listener) {
				o, _ := proxyReusePort(t, p.pod, OutboundPort, false)
				i, _ := proxyReusePort(t, p.pod, InboundPort, false)
				return o, i
			}
		}},
		{"ebpf", func(t *testing.T) (Backend, setup, func(*testing.T) (listener, listener)) {
			root := bpffsRoot(t)
			p := newEbpfPair(t)
			return Ebpf{Root: root}, setup{p.pod, p.out, "10.241.0.1:80", "10.241.0.2:8080"}, func(t *testing.T) (listener, listener) {
				o, ol := proxyReusePort(t, p.pod, OutboundPort, true)
				i, il := proxyReusePort(t, p.pod, InboundPort, false)
				withSocks(t, root, p.pod, func(m *ebpf.Map) {
					for s, c := range map[sockmap.Slot]syscall.Conn{sockmap.Outbound: ol, sockmap.Inbound: il} {
						if err := sockmap.Register(m, s, c); err != nil {
							t.Fatal(err)
						}
					}
				})
				return o, i
			}
		}},
	}
	attacks := []struct {
		name     string
		ownPidns bool
	}{
		{"pod PID namespace", true},
		{"node PID namespace", false},
	}
	binds := []string{
		"tcp [::]:15001", "tcp [::]:15006", "tcp 0.0.0.0:15001", "tcp [::]:15008",
		"udp [::]:15053", "udp 127.0.0.1:15053",
	}
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			g := openGuard(t)
			// This process is the node proxy.
			if err := g.Admit(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			backend, s, listenAsProxy := be.b(t)
			b := Guarded{Backend: backend, Guard: g}
			cfg := DefaultPodConfig()
			if err := b.Enroll(s.pod, cfg); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(s.pod, cfg); err != nil {
				t.Fatal(err)
			}
			outbound, inbound := listenAsProxy(t)
			for _, a := range attacks {
				t.Run(a.name, func(t *testing.T) {
					// What a pod's sysctls may set: the kernel's own
					// choice of a port limited to the proxy's ports and
					// a few more, while the attacker's sockets pick
					// theirs (the test's connections need more).
					setPortRange(t, s.pod, "15000 15010")
					attacker := startRole(t, s.pod, a.ownPidns, roleSpec{DropCaps: true, Binds: binds, Autobinds: 3})
					setPortRange(t, s.pod, "32768 60999")
					if attacker.ready.Caps&(1<<unix.CAP_NET_ADMIN|1<<unix.CAP_SYS_ADMIN|1<<unix.CAP_BPF) != 0 ||
						attacker.ready.Caps&(1<<unix.CAP_SETUID|1<<unix.CAP_NET_RAW|1<<unix.CAP_SYS_CHROOT) == 0 {
						t.Fatalf("attacker's capabilities %#x, want a container's", attacker.ready.Caps)
					}
					for i, err := range attacker.ready.Binds {
						if !strings.Contains(err, "operation not permitted") {
							t.Errorf("attacker's bind %q: %q, want EPERM", binds[i], err)
						}
					}
					for _, p := range attacker.ready.Autobound {
						if slices.Contains(bpfprog.GuardedPorts(), uint16(p)) {
							t.Errorf("the kernel gave the attacker port %d", p)
						}
					}
					failed := 0
					for range attackConns {
						for _, d := range []struct{ from, to string }{{s.pod, s.outDst}, {s.out, s.inDst}} {
							c, err := dialQuick(d.from, netip.Addr{}, 0, d.to)
							if err != nil {
								failed++
								continue
							}
							c.Close()
						}
					}
					got := attacker.counts(t)
					proxyOut, proxyIn := drain(outbound), drain(inbound)
					t.Logf("of %d connections each way, the attacker received %v (by bind), the proxy %d outbound and %d inbound, %d failed; the kernel picked ports %v for it",
						attackConns, got, proxyOut, proxyIn, failed, attacker.ready.Autobound)
					stolen := 0
					for _, n := range got {
						stolen += n
					}
					if stolen != 0 || proxyOut != attackConns || proxyIn != attackConns {
						t.Errorf("attacker received %d connections, the proxy %d of %d outbound and %d of %d inbound (%d failed); want 0 and all",
							stolen, proxyOut, attackConns, proxyIn, attackConns, failed)
					}
				})
			}
			problems, err := g.Problems(s.pod, true)
			if err != nil || len(problems) > 0 {
				t.Errorf("Problems after the attack = %v, %v", problems, err)
			}
		})
	}
}

// TestGuardFindsSocketsBoundFirst is the attack of a pod's process that
// binds the proxy's port before its namespace is guarded, when no bind
// hook refuses it yet. Each case holds such a socket (as this process,
// which is no registered proxy) and asks Guard and Problems about the
// namespace: the pod must be refused, and reported.
//   - bound, not listening: listen() joins the proxy's SO_REUSEPORT group
//     later, with no bind for the guard to refuse;
//   - listening while no node proxy is registered: nothing can tell the
//     socket is not a proxy's.
func TestGuardFindsSocketsBoundFirst(t *testing.T) {
	g := openGuard(t)
	for _, tc := range []struct {
		name   string
		listen bool
		proxy  bool // a node proxy (another process) is registered
	}{
		{"bound to listen later, a proxy registered", false, true},
		{"listening, no proxy registered", true, false},
		{"bound to listen later, no proxy registered", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.proxy {
				other := exec.Command("sleep", "60")
				if err := other.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
				if err := g.Admit(other.Process.Pid); err != nil {
					t.Fatal(err)
				}
				// Its slot is freed when it exits, before the next case.
				t.Cleanup(func() {
					_ = other.Process.Kill()
					_ = other.Wait()
					eventually.Within(t, 5*time.Second, "the proxy's slot freed", func() bool {
						_, ok, _ := g.proxySockets(true)
						return !ok
					})
				})
			}
			p := newPair(t)
			var fd int
			err := netns.Do(p.pod, func() (err error) {
				if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
					return err
				}
				if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
					return err
				}
				if err := unix.Bind(fd, &unix.SockaddrInet6{Port: InboundPort}); err != nil {
					return err
				}
				if tc.listen {
					return unix.Listen(fd, 16)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if err := g.Guard(p.pod); !errors.Is(err, ErrPortTaken) || !strings.Contains(err.Error(), "tcp port 15006") {
				t.Errorf("Guard with the pod's socket on 15006 = %v, want ErrPortTaken naming it", err)
			}
			problems, err := g.Problems(p.pod, true)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, "tcp port 15006") }) {
				t.Errorf("Problems = %q, want the socket on 15006", problems)
			}
		})
	}
}
