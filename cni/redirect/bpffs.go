package redirect

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// ErrNotBPFFS is a pin directory that is not on a BPF filesystem: pins
// elsewhere are impossible, and the eBPF backend's attachments would not
// outlive the agent. Mounting one is the agent's job at start
// (sockmap.MountBPFFS on /sys/fs/bpf), not the backend's: it is a decision
// about the node, not about a pod.
var ErrNotBPFFS = errors.New("not on a BPF filesystem")

// checkBPFFS fails with ErrNotBPFFS unless root, or the nearest directory
// above it that exists (root itself is created on first use), is on a BPF
// filesystem.
func checkBPFFS(root string) error {
	dir := filepath.Clean(root)
	for {
		ok, err := sockmap.IsBPFFS(dir)
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
