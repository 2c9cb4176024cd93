package realnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Init is the node's init process (canopy-local node-init): born by Boot
// in a new mount and UTS namespace inside the node's network namespace, it
// makes the node's mounts and hostname, reports on ready (one line), and
// then holds the namespaces until it is told to stop (SIGTERM or SIGINT).
// Everything it mounted goes with the mount namespace when the node's last
// process ends.
func Init(s Spec, ready *os.File) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := mountNode(s); err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		return err
	}
	if err := unix.Sethostname([]byte(s.Name)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGTERM, unix.SIGINT)
	if _, err := fmt.Fprintln(ready, "ready"); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	ready.Close()
	<-sig
	return nil
}

// mountNode makes the node's view of the file system.
func mountNode(s Spec) error {
	// A new mount namespace starts with the host's propagation: shared
	// mounts would carry the node's binds back to the host. Slave first
	// (host mounts still arrive, the node's stay here), then shared within
	// the node, which the kubelet and containerd want for volumes with
	// mount propagation.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave mount: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared within the node: %w", err)
	}
	for _, b := range s.Binds() {
		if err := mkdirs(b.Source, b.Target); err != nil {
			return err
		}
		if err := unix.Mount(b.Source, b.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", b.Source, b.Target, err)
		}
	}
	// /run is the node's own and empty at each boot, as kind's tmpfs:
	// containerd's state and shim sockets, pods' network namespace pins,
	// agents' sockets (/var/run is a link to it).
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on /run: %w", err)
	}
	// Pinned eBPF programs and maps are per node, as on separate machines.
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on /sys/fs/bpf: %w", err)
	}
	return nil
}

func mkdirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create %s: %w", filepath.Clean(d), err)
		}
	}
	return nil
}
