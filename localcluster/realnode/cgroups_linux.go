package realnode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// hierarchy is a mounted cgroup hierarchy: a cgroup v1 controller set or
// the v2 hierarchy.
type hierarchy struct {
	mount string
	// cpuset: a v1 cpuset hierarchy, whose new cgroups start with no
	// CPUs or memory nodes and take no processes until given them.
	cpuset bool
}

// hierarchies lists every cgroup hierarchy mounted at its root: on a hybrid
// host each cgroup v1 controller set and the (maybe empty) v2 one; on a v2
// host the one. The kubelet's cgroupfs driver on cgroup v1 wants its root in
// every v1 controller, and a process not placed in each would stay in the
// host's cgroup there.
func hierarchies() ([]hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hs []hierarchy
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+3 >= len(fields) || fields[3] != "/" {
			continue
		}
		fstype, mount := fields[sep+1], fields[4]
		if (fstype != "cgroup" && fstype != "cgroup2") || seen[mount] {
			continue
		}
		seen[mount] = true
		opts := strings.Split(fields[sep+3], ",")
		hs = append(hs, hierarchy{mount: mount, cpuset: fstype == "cgroup" && slices.Contains(opts, "cpuset")})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	if len(hs) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return hs, nil
}

// createCgroup makes rel (a relative cgroup path) in every hierarchy.
func createCgroup(rel string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := h.mount
		for _, part := range strings.Split(rel, "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
				continue
			} else if err != nil {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			if h.cpuset {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					b, err := os.ReadFile(filepath.Join(parent, f))
					if err != nil {
						return fmt.Errorf("read %s of %s: %w", f, parent, err)
					}
					if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
						return fmt.Errorf("write %s of %s: %w", f, dir, err)
					}
				}
			}
		}
	}
	return nil
}

// joinCgroup moves pid into rel in every hierarchy.
func joinCgroup(rel string, pid int) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		p := filepath.Join(h.mount, rel, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move %d into %s: %w", pid, p, err)
		}
	}
	return nil
}

// cgroupPIDs lists the processes in rel and below, in every hierarchy.
func cgroupPIDs(hs []hierarchy, rel string) []int {
	var pids []int
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h.mount, rel), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// RemoveCgroup kills every process in rel and below (containers, shims,
// the node's daemons), in every hierarchy, and removes the cgroups bottom
// up. A missing cgroup is not an error.
func RemoveCgroup(rel string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	if err := killCgroup(hs, rel); err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		root := filepath.Join(h.mount, rel)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: a cgroup goes only when it has no children.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirRetry(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// killCgroup kills every process in rel and below until none is left: a
// process forked meanwhile is killed on the next round.
func killCgroup(hs []hierarchy, rel string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := cgroupPIDs(hs, rel)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v do not die", rel, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rmdirRetry removes an empty cgroup; the kernel reports EBUSY for a moment
// after its last process died.
func rmdirRetry(dir string) error {
	var err error
	for range 100 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

// CanLowerOOMScore reports whether this process may lower an oom_score_adj
// (CAP_SYS_RESOURCE in its effective set), as runc does for the kubelet's
// sandboxes and Guaranteed pods.
func CanLowerOOMScore() (bool, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("CapEff %q: %w", v, err)
			}
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0, nil
		}
	}
	return false, errors.New("/proc/self/status has no CapEff line")
}

// PodPIDs lists the processes of the pod with uid on the node whose cgroup
// is nodeCgroup: the kubelet's cgroupfs driver names a pod's cgroup
// pod<uid> under <nodeCgroup>/pods/kubepods (and its QoS class).
func PodPIDs(nodeCgroup, uid string) ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	var found []string
	for _, h := range hs {
		root := filepath.Join(h.mount, nodeCgroup, "pods")
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == "pod"+uid {
				found = append(found, strings.TrimPrefix(p, h.mount+"/"))
				return fs.SkipDir
			}
			return nil
		})
		if len(found) > 0 {
			return cgroupPIDs(hs, found[0]), nil
		}
	}
	return nil, nil
}
