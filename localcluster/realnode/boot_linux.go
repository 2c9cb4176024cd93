package realnode

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/canopy-mesh/canopy/internal/atomicfile"
	"github.com/canopy-mesh/canopy/internal/netns"
)

// Recorder notes a long-lived process the node started, so that whoever
// tears the cluster down stops it (the kubelet before containerd before
// init: in the order recorded, reversed).
type Recorder func(name string, pid int) error

// Node is a booted node.
type Node struct {
	Spec Spec
	// InitPID is the init process holding the node's namespaces.
	InitPID int
	// Mountpoints are the directories Boot created on the host for the
	// node's binds; empty ones are the host's to remove after the node.
	Mountpoints []string
	logDir      string
	self        string
	record      Recorder
}

// specFile is where Boot keeps the node's spec, in the node's directory,
// for init and for Attach.
const specFile = "node.json"

// nofile is containerd's (and so the shims' and containers') open file
// limit: as high as this host lets it go (containerd's own service unit
// asks for no limit at all), where Go programs start with a soft limit of
// 1024 handed down from their parent.
func nofile() string {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return "65536"
	}
	return strconv.FormatUint(l.Max, 10)
}

// Boot writes the node's files under s.Dir, makes its cgroups and starts
// init, containerd and the kubelet, each recorded as it starts. self is a
// binary whose "node-init --spec FILE" runs Init; logs go to logDir as
// <node>-<process>.log. It returns when containerd answers; the kubelet
// registers the Node on its own.
func Boot(ctx context.Context, s Spec, self, logDir string, record Recorder) (*Node, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	n := &Node{Spec: s, logDir: logDir, self: self, record: record}
	if err := n.writeFiles(); err != nil {
		return nil, err
	}
	for _, c := range []string{s.runtimeCgroup(), s.podsCgroup()} {
		if err := createCgroup(c); err != nil {
			return nil, err
		}
	}
	var err error
	if n.Mountpoints, err = createMountpoints(s.Binds()); err != nil {
		return nil, err
	}
	if err := n.startInit(ctx); err != nil {
		return n, err
	}
	if err := n.StartContainerd(ctx); err != nil {
		return n, err
	}
	return n, n.StartKubelet()
}

// Attach returns the node that Boot started from the spec it wrote under
// dir, whose init is initPID, so that a later process (a test, canopy-local)
// can restart its parts. self, logDir and record are as for Boot.
func Attach(dir string, initPID int, self, logDir string, record Recorder) (*Node, error) {
	b, err := os.ReadFile(filepath.Join(dir, specFile))
	if err != nil {
		return nil, fmt.Errorf("the node's spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("the node's spec %s: %w", filepath.Join(dir, specFile), err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &Node{Spec: s, InitPID: initPID, logDir: logDir, self: self, record: record}, nil
}

// RestartContainerd stops the node's containerd as its service manager
// does on a restart (SIGTERM; the shims, and so the containers, go on
// running) and starts it again.
func (n *Node) RestartContainerd(ctx context.Context) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var daemon []int
	for _, pid := range cgroupPIDs(hs, n.Spec.runtimeCgroup()) {
		if comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); err == nil && strings.TrimSpace(string(comm)) == "containerd" {
			daemon = append(daemon, pid)
		}
	}
	if len(daemon) != 1 {
		return fmt.Errorf("%s: want one containerd process in cgroup %s, found %v", n.Spec.Name, n.Spec.runtimeCgroup(), daemon)
	}
	if err := syscall.Kill(daemon[0], syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop containerd of %s: %w", n.Spec.Name, err)
	}
	if err := waitGone(ctx, daemon[0]); err != nil {
		return fmt.Errorf("containerd of %s: %w", n.Spec.Name, err)
	}
	return n.StartContainerd(ctx)
}

// Reboot ends every process of the node at once, as a power cut does (its
// containers, the shims, containerd, the kubelet and init, and with init
// the node's mounts: /run and /sys/fs/bpf start empty again; its cgroups
// are removed), runs
// whileDown (to change the node's disk as something on it would at boot),
// and boots it again from the same spec. The node's network namespace, with
// its links, routes and kube-proxy's rules, outlives the reboot here.
func (n *Node) Reboot(ctx context.Context, whileDown func() error) error {
	// The node's cgroups go too, as the cgroup file systems start empty
	// at boot: the kubelet's cAdvisor would otherwise spend 3 s on each
	// dead container's cgroup before the kubelet syncs a pod (90 s here).
	if err := RemoveCgroup(n.Spec.Cgroup); err != nil {
		return fmt.Errorf("power off %s: %w", n.Spec.Name, err)
	}
	if err := waitGone(ctx, n.InitPID); err != nil {
		return fmt.Errorf("power off %s: %w", n.Spec.Name, err)
	}
	if whileDown != nil {
		if err := whileDown(); err != nil {
			return err
		}
	}
	booted, err := Boot(ctx, n.Spec, n.self, n.logDir, n.record)
	if booted != nil {
		n.InitPID = booted.InitPID
	}
	return err
}

// waitGone waits until process pid has exited (and is reaped, or is not our
// child).
func waitGone(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if state, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); err == nil && zombie(state) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d did not exit: %w", pid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// zombie reports whether a /proc/<pid>/stat line is a process that exited
// and waits for its parent to reap it: after the command name, in
// parentheses that the name itself may contain, comes the state.
func zombie(stat []byte) bool {
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// writeFiles writes what a node image and its provisioning would put on the
// node's disk.
func (n *Node) writeFiles() error {
	s := n.Spec
	containerd, err := s.ContainerdConfig()
	if err != nil {
		return err
	}
	kubelet, err := s.KubeletConfig()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		containerdConfigPath: containerd,
		kubeletConfigPath:    kubelet,
		resolvConfPath:       s.ResolvConf(),
	}
	for dir, b := range s.HostsTOML() {
		files[filepath.Join(certsDir, dir, "hosts.toml")] = b
	}
	for p, b := range files {
		if err := writeFile(s.HostPath(p), b, 0o644); err != nil {
			return err
		}
	}
	for _, plugin := range []string{"loopback", "ptp", "host-local"} {
		b, err := os.ReadFile(filepath.Join(s.Binaries.CNI, plugin))
		if err != nil {
			return fmt.Errorf("CNI plugin %s: %w", plugin, err)
		}
		if err := writeFile(s.HostPath(filepath.Join(cniBinDir, plugin)), b, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// HostPath is where the host finds the node's path p (one of its
// persistent directories).
func (s Spec) HostPath(p string) string { return filepath.Join(s.Dir, p) }

// writeFile replaces p atomically: a daemon restarting meanwhile reads the
// old file or the new, never half of one.
func writeFile(p string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, b, mode)
}

// createMountpoints makes the bind targets the host lacks and returns
// them, parents before children.
func createMountpoints(binds []Bind) ([]string, error) {
	var made []string
	for _, b := range binds {
		var missing []string
		for d := b.Target; d != "/"; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil {
				break
			} else if !errors.Is(err, fs.ErrNotExist) {
				return made, err
			}
			missing = append([]string{d}, missing...)
		}
		for _, d := range missing {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return made, fmt.Errorf("create mount point %s: %w", d, err)
			}
			made = append(made, d)
		}
		if err := os.MkdirAll(b.Source, 0o755); err != nil {
			return made, err
		}
	}
	return made, nil
}

// startInit starts the node's init and waits for its mounts.
func (n *Node) startInit(ctx context.Context) error {
	s := n.Spec
	specPath := filepath.Join(s.Dir, specFile)
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFile(specPath, b, 0o600); err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(n.self, "node-init", "--spec", specPath)
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS}
	pid, err := n.spawn("init", cmd, func() error { return netns.Do(s.Netns, cmd.Start) })
	w.Close()
	if err != nil {
		return err
	}
	n.InitPID = pid
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case l := <-line:
		if l != "ready" {
			return fmt.Errorf("node init: %s (log: %s)", strings.TrimPrefix(l, "error: "), n.logPath("init"))
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("node init did not report ready in 30s (log: %s)", n.logPath("init"))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inNode is argv run inside the node's namespaces.
func (n *Node) inNode(argv ...string) *exec.Cmd {
	pid := strconv.Itoa(n.InitPID)
	cmd := exec.Command("nsenter", append([]string{"--target", pid, "--mount", "--uts", "--net", "--"}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// StartContainerd starts the node's containerd and waits until its socket
// answers: at boot, or again after it was stopped.
func (n *Node) StartContainerd(ctx context.Context) error {
	cmd := n.inNode("prlimit", "--nofile="+nofile()+":"+nofile(), "--",
		filepath.Join(n.Spec.Binaries.Containerd, "containerd"), "--config", containerdConfigPath)
	if _, err := n.spawn("containerd", cmd, cmd.Start); err != nil {
		return err
	}
	sock := n.ContainerdSocket()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd of %s does not answer on %s: %w (log: %s)", n.Spec.Name, sock, err, n.logPath("containerd"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ContainerdSocket is the node's containerd socket as the host reaches it
// (through init's root, since /run is the node's own).
func (n *Node) ContainerdSocket() string {
	return filepath.Join("/proc", strconv.Itoa(n.InitPID), "root", containerdSocket)
}

// StartKubelet starts the node's kubelet.
func (n *Node) StartKubelet() error {
	cmd := n.inNode(append([]string{n.Spec.Binaries.Kubelet}, n.Spec.KubeletArgs()...)...)
	_, err := n.spawn("kubelet", cmd, cmd.Start)
	return err
}

func (n *Node) logPath(what string) string {
	return filepath.Join(n.logDir, n.Spec.Name+"-"+what+".log")
}

// spawn starts cmd with start, detached, its output appended to its log,
// moves it into the node's runtime cgroup before it can start children,
// and records it.
func (n *Node) spawn(what string, cmd *exec.Cmd, start func() error) (int, error) {
	if err := os.MkdirAll(n.logDir, 0o755); err != nil {
		return 0, err
	}
	logFile, err := os.OpenFile(n.logPath(what), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := start(); err != nil {
		logFile.Close()
		return 0, fmt.Errorf("start %s of %s: %w", what, n.Spec.Name, err)
	}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
	}()
	pid := cmd.Process.Pid
	if err := joinCgroup(n.Spec.runtimeCgroup(), pid); err != nil {
		_ = cmd.Process.Kill()
		return 0, err
	}
	return pid, n.record(n.Spec.Name+"-"+what, pid)
}
