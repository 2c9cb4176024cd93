// Package netns creates, enters and removes named network namespaces, the
// way `ip netns` does: each is pinned by a bind mount at /run/netns/<name>,
// so it outlives the process that made it and shows in `ip netns list`.
//
// Functions are safe for concurrent use. Entering a namespace happens on a
// locked OS thread that never serves other goroutines while inside.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Dir is where named namespaces are pinned.
const Dir = "/run/netns"

// Path returns the pin path of the namespace called name.
func Path(name string) string { return filepath.Join(Dir, name) }

// Create makes a new network namespace called name with its loopback up and
// returns its path. It fails if the name is taken.
func Create(name string) (string, error) {
	if err := ensureSharedDir(); err != nil {
		return "", err
	}
	path := Path(name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return "", fmt.Errorf("create netns pin %s: %w", path, err)
	}
	f.Close()

	// Unshare on a locked thread, pin the new namespace, and go back to
	// the thread's own namespace before unlocking it. Letting the thread
	// die with the goroutine instead is not enough: on the main thread Go
	// keeps it, parked, and /proc/self (the main thread's view) would
	// then show the new namespace to the whole process. A thread that
	// cannot go back stays locked, so it dies with the goroutine.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open the thread's network namespace: %w", err)
			return
		}
		defer own.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(self, path, "none", unix.MS_BIND, "")
		if serr := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); serr == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			errc <- fmt.Errorf("pin network namespace at %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return "", err
	}
	if err := Do(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		return "", errors.Join(fmt.Errorf("set lo up in %s: %w", name, err), Delete(name))
	}
	return path, nil
}

// Delete unpins and removes the namespace called name. The namespace itself
// goes away when no process is left in it. A missing namespace is not an
// error, so Delete is safe to repeat.
func Delete(name string) error {
	return DeletePath(Path(name))
}

// DeletePath is Delete for a pin path.
func DeletePath(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// Exists reports whether a namespace is pinned at path.
func Exists(path string) bool {
	return ns.IsNSorErr(path) == nil
}

// Do runs fn with the calling goroutine's thread inside the namespace at
// path, and back in the original namespace afterwards. Processes started
// from fn (exec.Cmd.Start) are born in the namespace.
func Do(path string, fn func() error) error {
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// ensureSharedDir makes Dir a shared mount point, as `ip netns` does, so
// that pins made later also appear in mount namespaces copied earlier.
func ensureSharedDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", Dir, err)
	}
	err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", Dir, err)
	}
	// EINVAL: not a mount point yet. Bind it onto itself, then share it.
	if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", Dir, err)
	}
	if err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", Dir, err)
	}
	return nil
}
