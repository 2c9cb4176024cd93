// Package containerinit turns a process into a local cluster "container":
// born in a pod's network namespace and a mount (and UTS) namespace of its
// own, it bind-mounts the pod's files (resolv.conf, hosts, volumes) over
// their paths, sets the pod's hostname and executes the container's
// program. The kubelet stand-in starts it by re-executing its own binary
// with the hidden argument Arg.
package containerinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Arg is the first argument that makes the binary act as a container init.
const Arg = "__container-init"

// Spec says what a container's mount namespace holds and what it runs.
type Spec struct {
	Hostname   string  `json:"hostname,omitempty"`
	Mounts     []Mount `json:"mounts,omitempty"`
	WorkingDir string  `json:"workingDir,omitempty"`
	// Argv is the program and its arguments; Argv[0] is an absolute path.
	Argv []string `json:"argv"`
}

// Mount bind-mounts Source over Target inside the container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// Bidirectional makes mounts the container makes under Target appear
	// on the host too (Kubernetes mount propagation Bidirectional). Host
	// mounts always reach the container.
	Bidirectional bool `json:"bidirectional,omitempty"`
}

// Command returns the command that runs spec as a container: self (a binary
// whose main calls Main for Arg) in new mount and UTS namespaces. Start it
// inside the pod's network namespace; set Env, Stdout and Stderr as for the
// program itself.
func Command(self string, spec Spec) (*exec.Cmd, error) {
	if len(spec.Argv) == 0 || !filepath.IsAbs(spec.Argv[0]) {
		return nil, fmt.Errorf("container program %q is not an absolute path", spec.Argv)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode container spec: %w", err)
	}
	cmd := exec.Command(self, Arg, string(b))
	flags := uintptr(unix.CLONE_NEWNS)
	if spec.Hostname != "" {
		flags |= unix.CLONE_NEWUTS
	}
	// Setpgid: stopping a container signals its whole process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Setpgid: true}
	return cmd, nil
}

// Main runs as the container init: args are what follows Arg. It returns
// only on error; the caller prints it and exits non-zero.
func Main(args []string) error {
	if len(args) != 1 {
		return errors.New("want one argument: the container spec as JSON")
	}
	var spec Spec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		return fmt.Errorf("decode container spec: %w", err)
	}
	if len(spec.Argv) == 0 {
		return errors.New("container spec has no program")
	}
	// Mounts made here must not leak back to the host, but the host's must
	// still reach the container: a network namespace pinned or unpinned
	// under /run/netns after the container started, say.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves of the host: %w", err)
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	for _, m := range spec.Mounts {
		if err := bind(m); err != nil {
			return err
		}
	}
	if spec.WorkingDir != "" {
		if err := os.Chdir(spec.WorkingDir); err != nil {
			return fmt.Errorf("change to working directory: %w", err)
		}
	}
	if err := unix.Exec(spec.Argv[0], spec.Argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", spec.Argv[0], err)
	}
	return nil
}

// bind mounts m.Source over m.Target, creating the target (an empty file or
// directory like the source) when it does not exist. A created mount point
// stays on the host file system, empty.
func bind(m Mount) error {
	src, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	if _, err := os.Stat(m.Target); errors.Is(err, os.ErrNotExist) {
		if src.IsDir() {
			err = os.MkdirAll(m.Target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(m.Target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(m.Target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
	}
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := unix.Mount("", m.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", m.Target, err)
		}
	}
	if m.Bidirectional {
		if err := unix.Mount("", m.Target, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("share %s with the host: %w", m.Target, err)
		}
	}
	return nil
}
