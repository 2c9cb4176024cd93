// Package cgroup puts processes into cgroups of the cgroup v2 hierarchy and
// removes those cgroups again, the way a container runtime places a pod's
// containers under a cgroup named after the pod (.../kubepods/pod<uid>/).
// The local cluster's kubelet stand-in uses it so that a pod's processes
// carry their pod's UID as on a real node, and tests use it to make such
// processes.
//
// Paths are absolute directories under the hierarchy's mount point (Root).
// Functions are safe for concurrent use on different cgroups.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoHierarchy: no cgroup v2 hierarchy is mounted.
var ErrNoHierarchy = errors.New("no cgroup v2 hierarchy mounted")

// Root returns the mount point of the cgroup v2 hierarchy:
// /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one.
func Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup2" && fields[3] == "/" {
			return unescape(fields[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	return "", ErrNoHierarchy
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Start starts cmd with its process born in the cgroup at dir, which is
// created (with its parents) if missing. The process never runs outside
// it: the kernel places it at clone (CLONE_INTO_CGROUP).
func Start(cmd *exec.Cmd, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	defer d.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(d.Fd())
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start in cgroup %s: %w", dir, err)
	}
	return nil
}

// Remove kills every process in the cgroup at dir and in the cgroups below
// it, then removes them all, deepest first. A missing cgroup is not an
// error, so Remove is safe to repeat.
func Remove(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list cgroup %s: %w", dir, err)
	}
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := kill(d); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// kill kills the processes of one cgroup and waits, up to 5s, until the
// kernel has taken them out.
func kill(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := Procs(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v do not exit", dir, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Procs lists the processes in the cgroup at dir (not below it).
func Procs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
