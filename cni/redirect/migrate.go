package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// MigrateSysctl is net.ipv4.tcp_migrate_req (Linux 5.14 and later), a
// setting of each network namespace that applies to TCP of both families.
// On, a listening socket of a SO_REUSEPORT group that closes hands the
// connections in its accept queue, and the handshakes under way, to
// another socket of the group; off, the kernel resets them. The node
// proxy's in-pod listeners are such a group while an old and a new proxy
// both serve a pod, so an ambient pod's namespace gets it on: the old
// proxy then stops accepting by closing its listeners, and nothing the
// kernel had queued for it is lost (node/README.md, "Upgrades").
//
// It is left on when the pod leaves the mesh: an app's own SO_REUSEPORT
// listeners only gain the same hand-over, the agent cannot tell whether
// the app had turned it on itself, and the node proxy's listeners are
// closed at that point anyway, with no other proxy to take over.
//
// /proc/sys/net shows the namespace of the thread that opens the file, so
// it is read and written from a thread inside the pod's namespace.
const MigrateSysctl = "/proc/sys/net/ipv4/tcp_migrate_req"

// MigrateSupported reports whether the kernel has MigrateSysctl. The
// setting exists in every namespace or in none, so the caller's own
// namespace answers for the pods'. Without it, Enroll and Verify leave it
// alone.
func MigrateSupported() bool {
	_, err := os.Stat(MigrateSysctl)
	return err == nil
}

// migrateFor is what Enroll does to MigrateSysctl: on for ambient pods,
// which the node proxy serves; a sidecar pod's is left as it is.
func migrateFor(netnsPath string, cfg PodConfig) error {
	if cfg.Sidecar != nil {
		return nil
	}
	return ensureMigrate(netnsPath)
}

// ensureMigrate turns MigrateSysctl on in the netns at path; a kernel
// without it is left as it is.
func ensureMigrate(path string) error {
	err := netns.Do(path, func() error {
		on, err := migrateOn()
		if err != nil || on {
			return err
		}
		return os.WriteFile(MigrateSysctl, []byte("1"), 0o644)
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("turn on net.ipv4.tcp_migrate_req in %s: %w", path, err)
	}
	return nil
}

// verifyMigrate lists MigrateSysctl as drift when it is off in the netns
// at path; a kernel without it has nothing to verify.
func verifyMigrate(path string) ([]string, error) {
	var on bool
	err := netns.Do(path, func() (err error) {
		on, err = migrateOn()
		return err
	})
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read net.ipv4.tcp_migrate_req in %s: %w", path, err)
	case !on:
		return []string{"net.ipv4.tcp_migrate_req is 0, want 1"}, nil
	}
	return nil, nil
}

// migrateOn reads MigrateSysctl in the calling thread's namespace.
func migrateOn() (bool, error) {
	b, err := os.ReadFile(MigrateSysctl)
	if err != nil {
		return false, err
	}
	return string(bytes.TrimSpace(b)) != "0", nil
}
