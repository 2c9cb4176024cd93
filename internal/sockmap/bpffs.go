package sockmap

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// IsBPFFS reports whether dir is on a BPF filesystem, where pins can be
// made.
func IsBPFFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

// MountBPFFS mounts a BPF filesystem on dir (usually /sys/fs/bpf) unless
// one is there already, as a node's init system does at boot. Pins live as
// long as the filesystem's mount, so the node's own mount must be the one
// used: mounting here in a container's private mount namespace would lose
// the pins with the container, which is why the agent's DaemonSet mounts
// the host's directory with bidirectional propagation.
func MountBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	ok, err := IsBPFFS(dir)
	if err != nil || ok {
		return err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount a BPF filesystem on %s: %w", dir, err)
	}
	return nil
}
