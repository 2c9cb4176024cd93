package redirect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrNotBPFFS is a pin directory that is not on a BPF filesystem: pins
// elsewhere are impossible, and the eBPF backend's attachments would not
// outlive the agent.
var ErrNotBPFFS = errors.New("not on a BPF filesystem")

// EnsureBPFFS mounts a BPF filesystem at dir (typically /sys/fs/bpf,
// created if missing) unless dir already is on one, which includes any
// directory inside a mounted BPF filesystem (a missing one is then
// created there). The agent calls it once at
// start; the eBPF backend only checks (Ebpf.Enroll fails with ErrNotBPFFS
// otherwise), because mounting is a decision about the node, not about a
// pod.
func EnsureBPFFS(dir string) error {
	err := checkBPFFS(dir)
	if err != nil && !errors.Is(err, ErrNotBPFFS) {
		return err
	}
	if mkErr := os.MkdirAll(dir, 0o700); mkErr != nil {
		return fmt.Errorf("create %s: %w", dir, mkErr)
	}
	if err == nil {
		// Already on one (a directory created above in it, if missing).
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount a BPF filesystem at %s: %w", dir, err)
	}
	return nil
}

// onBPFFS reports whether path is on a BPF filesystem.
func onBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

// checkBPFFS fails with ErrNotBPFFS unless root, or the nearest directory
// above it that exists (root itself is created on first use), is on a BPF
// filesystem.
func checkBPFFS(root string) error {
	dir := filepath.Clean(root)
	for {
		ok, err := onBPFFS(dir)
		if err == nil {
			if !ok {
				return fmt.Errorf("eBPF pin directory %s: %w (mount one there, or at a directory above it, e.g. mount -t bpf bpf /sys/fs/bpf)", root, ErrNotBPFFS)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("eBPF pin directory %s: %w", root, err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fmt.Errorf("eBPF pin directory %s: %w", root, err)
		}
		dir = parent
	}
}
