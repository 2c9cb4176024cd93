// Package install puts the canopy-cni plugin on a node and keeps it there:
// the binary into the CNI bin dir, an entry at the end of the network
// configuration's plugin chain, and a watch that puts the entry back when
// another CNI rewrites its file.
//
// The chain lives in one of two places. By default (Installer.OwnedFile)
// in a file of Canopy's own, named to come before the primary CNI's, which
// the container runtime then uses: the primary's plugins followed by the
// entry, written again whenever the primary's file changes. It persists
// across node reboots while the primary CNI may rewrite its own file at
// boot before the agent runs, so a pod's sandbox is never set up without
// the plugin (which fails closed until the agent answers). Otherwise the
// entry is chained into the primary's file itself, edited as bytes
// (conflist.go) so that no other byte of it changes, nor its mode or owner,
// and uninstalling restores it; a primary CNI that rewrites its file while
// the agent is down then starts pods outside the mesh until the agent is
// back.
package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/canopy-mesh/canopy/internal/atomicfile"
)

// PluginType is the plugin's "type" in a conflist.
const PluginType = "canopy-cni"

// Installer installs the plugin.
type Installer struct {
	// ConfDir and BinDir are the node's CNI directories
	// (/etc/cni/net.d, /opt/cni/bin).
	ConfDir, BinDir string
	// PluginBinary is the canopy-cni binary to copy.
	PluginBinary string
	// Entry is the plugin's configuration in the chain; "type" is set.
	Entry map[string]any
	// OwnedFile, when set, is the name of Canopy's own configuration
	// file in ConfDir (a .conflist that sorts before the primary's, such
	// as 02-canopy-cni.conflist); empty chains into the primary's file.
	OwnedFile string
	// Recheck is how often the configuration is checked even without a
	// file event (default 10s).
	Recheck time.Duration
	Log     *slog.Logger
}

// ErrNoPrimary: no network configuration to join yet (the primary CNI
// has not written its file).
var ErrNoPrimary = errors.New("no primary CNI configuration")

// Install copies the binary and inserts the entry; both are no-ops when
// already in place.
func (i Installer) Install() error {
	if err := i.copyBinary(); err != nil {
		return err
	}
	return i.ensureEntry()
}

func (i Installer) copyBinary() error {
	src, err := os.ReadFile(i.PluginBinary)
	if err != nil {
		return fmt.Errorf("read plugin binary: %w", err)
	}
	dst := filepath.Join(i.BinDir, PluginType)
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, src) {
		return nil
	}
	return atomicfile.Write(dst, src, 0o755)
}

// primary returns the primary CNI's configuration file: the first
// .conflist, .conf or .json in name order, as kubelet and containerd pick
// it, other than Canopy's own file.
func (i Installer) primary() (string, error) {
	return i.first(i.OwnedFile)
}

// first returns the first configuration file in name order, skipping the
// name skip ("" skips none): the one the runtime uses.
func (i Installer) first(skip string) (string, error) {
	entries, err := os.ReadDir(i.ConfDir)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", i.ConfDir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || (skip != "" && name == skip) {
			continue
		}
		if ext := filepath.Ext(name); ext == ".conflist" || ext == ".conf" || ext == ".json" {
			return filepath.Join(i.ConfDir, name), nil
		}
	}
	return "", ErrNoPrimary
}

// checkOwnedFile refuses an owned file name the runtime would not use or
// that could name a file elsewhere.
func (i Installer) checkOwnedFile() error {
	n := i.OwnedFile
	if n != filepath.Base(n) || strings.HasPrefix(n, ".") || filepath.Ext(n) != ".conflist" {
		return fmt.Errorf("CNI configuration file name %q: want a .conflist name without a directory, not hidden", n)
	}
	return nil
}

// owned returns what Canopy's own file holds given the primary's file:
// the primary's plugin list (without the entry, which an earlier chained
// install may have left in it) with the entry last. primary is the
// primary's path, for errors and order.
func (i Installer) owned(primary string, raw, entry []byte) ([]byte, error) {
	if err := i.checkOwnedFile(); err != nil {
		return nil, err
	}
	if i.OwnedFile >= filepath.Base(primary) {
		return nil, fmt.Errorf("%s does not sort before the primary CNI's %s: the runtime would not use it (choose a name that does)", i.OwnedFile, filepath.Base(primary))
	}
	base, _, err := unchain(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", primary, err)
	}
	if base == nil {
		base = raw
	}
	out, _, err := chain(base, entry)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", primary, err)
	}
	if out == nil {
		out = base
	}
	return out, nil
}

// wantOwned returns the primary's path and what Canopy's own file must
// hold now.
func (i Installer) wantOwned() (primary string, want []byte, err error) {
	if primary, err = i.primary(); err != nil {
		return "", nil, err
	}
	raw, _, err := readConfig(primary)
	if err != nil {
		return "", nil, err
	}
	entry, err := i.entry()
	if err != nil {
		return "", nil, err
	}
	want, err = i.owned(primary, raw, entry)
	return primary, want, err
}

// ensureOwned writes Canopy's own file from the primary's when it differs.
func (i Installer) ensureOwned() error {
	path, want, err := i.wantOwned()
	if err != nil {
		return err
	}
	dst := filepath.Join(i.ConfDir, i.OwnedFile)
	if cur, _, err := readConfig(dst); err == nil && bytes.Equal(cur, want) {
		return nil
	}
	if err := atomicfile.Write(dst, want, 0o644); err != nil {
		return err
	}
	i.Log.Info("wrote the CNI chain", "file", dst, "primary", path)
	return nil
}

// entry returns the plugin's configuration as it goes into the chain.
func (i Installer) entry() ([]byte, error) {
	e := map[string]any{}
	for k, v := range i.Entry {
		e[k] = v
	}
	e["type"] = PluginType
	b, err := marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode the plugin's entry: %w", err)
	}
	return b, nil
}

// maxConfig bounds what is read of a configuration file: the file is
// another vendor's, and a CNI configuration is a few kilobytes.
const maxConfig = 1 << 20

// readConfig reads a configuration file and returns what it is (mode,
// owner, inode) with its content. A symbolic link is refused: replacing it
// would put a copy where the link was, and the primary CNI's later changes
// to the link's target would no longer reach the runtime; following it
// from inside the agent's container may reach another file than the
// node's. So is anything but a regular file.
func readConfig(path string) ([]byte, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, nil, fmt.Errorf("%s is a symbolic link (left untouched: replace it with the file, or point the primary CNI at a file)", path)
	} else if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file but %v (left untouched)", path, info.Mode().Type())
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(raw) > maxConfig {
		return nil, nil, fmt.Errorf("%s is larger than %d bytes (left untouched)", path, maxConfig)
	}
	return raw, info, nil
}

// ensureEntry makes the configuration the runtime uses a plugin list
// whose last plugin is exactly the entry: Canopy's own file, or the
// primary's, changing no other byte of it, nor its mode or owner (see
// chain).
func (i Installer) ensureEntry() error {
	if i.OwnedFile != "" {
		return i.ensureOwned()
	}
	path, err := i.primary()
	if err != nil {
		return err
	}
	raw, info, err := readConfig(path)
	if err != nil {
		return err
	}
	entry, err := i.entry()
	if err != nil {
		return err
	}
	out, converted, err := chain(raw, entry)
	if err != nil {
		return fmt.Errorf("%s (left untouched): %w", path, err)
	}
	if out == nil {
		return nil
	}
	if !converted {
		if err := atomicfile.Swap(path, out, info, info); err != nil {
			return err
		}
		i.Log.Info("joined the CNI chain", "file", path)
		return nil
	}
	// A .conf (or .json) becomes a .conflist, written before the .conf
	// goes: the runtime, which takes the .conf first, has a configuration
	// at every moment.
	target := strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	prev, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		prev = nil
	case err != nil:
		return err
	case !prev.Mode().IsRegular():
		return fmt.Errorf("%s, where %s would become a plugin list, is not a regular file (left untouched)", target, path)
	}
	if err := atomicfile.Swap(target, out, info, prev); err != nil {
		return err
	}
	if err := removeIfSame(path, info); err != nil {
		return fmt.Errorf("remove %s after converting it to %s: %w", path, target, err)
	}
	i.Log.Info("joined the CNI chain", "file", target, "converted", path)
	return nil
}

// removeIfSame removes path if it is still the file read.
func removeIfSame(path string, read os.FileInfo) error {
	cur, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !os.SameFile(cur, read) {
		return atomicfile.ErrChanged
	}
	return os.Remove(path)
}

// InChain returns nil if the runtime runs the plugin for every new pod:
// the primary configuration (the first file, which the runtime uses) is a
// plugin list ending with the entry, and the binary is in BinDir.
// Otherwise it says what is missing.
func (i Installer) InChain() error {
	if i.OwnedFile != "" {
		return i.ownedInChain()
	}
	path, err := i.primary()
	if err != nil {
		return err
	}
	raw, _, err := readConfig(path)
	if err != nil {
		return err
	}
	d, err := parseDocument(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	entry, err := i.entry()
	if err != nil {
		return err
	}
	_, plugins, _, err := d.plugins()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(plugins) == 0 || !sameJSON(d.bytes(plugins[len(plugins)-1]), entry) {
		return fmt.Errorf("%s does not end with %s", path, PluginType)
	}
	if _, err := os.Stat(filepath.Join(i.BinDir, PluginType)); err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	return nil
}

// ownedInChain checks Canopy's own file: the runtime uses it (it comes
// first), it holds the primary's current plugins and the entry, and the
// binary is in BinDir.
func (i Installer) ownedInChain() error {
	path, want, err := i.wantOwned()
	if err != nil {
		return err
	}
	dst := filepath.Join(i.ConfDir, i.OwnedFile)
	if first, err := i.first(""); err != nil || first != dst {
		return fmt.Errorf("the runtime uses %s, not %s", first, dst)
	}
	cur, _, err := readConfig(dst)
	if err != nil {
		return err
	}
	if !bytes.Equal(cur, want) {
		return fmt.Errorf("%s does not hold %s's plugins followed by %s", dst, path, PluginType)
	}
	if _, err := os.Stat(filepath.Join(i.BinDir, PluginType)); err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	return nil
}

// Watch keeps the entry in place until ctx ends: on every change in the
// configuration directory, and every Recheck.
func (i Installer) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(i.ConfDir); err != nil {
		return fmt.Errorf("watch %s: %w", i.ConfDir, err)
	}
	recheck := i.Recheck
	if recheck <= 0 {
		recheck = 10 * time.Second
	}
	tick := time.NewTicker(recheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if strings.HasPrefix(filepath.Base(ev.Name), ".") {
				continue // our own temporary files
			}
		case err := <-w.Errors:
			i.Log.Warn("watching the CNI configuration", "err", err)
		case <-tick.C:
		}
		if err := i.Install(); err != nil && !errors.Is(err, ErrNoPrimary) {
			i.Log.Error("cannot keep the plugin in the CNI chain", "err", err)
		}
	}
}

// Uninstall removes the entry and the binary: Canopy's own file, and the
// entry from the primary configuration, which is left as it was before
// Install, byte for byte, with its mode and owner; a .conf that Install
// converted is a .conf again.
func (i Installer) Uninstall() error {
	var errs []error
	if i.OwnedFile != "" {
		if err := i.checkOwnedFile(); err != nil {
			errs = append(errs, err)
		} else if err := os.Remove(filepath.Join(i.ConfDir, i.OwnedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if path, err := i.primary(); err == nil {
		if err := removeEntry(path); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(filepath.Join(i.BinDir, PluginType)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func removeEntry(path string) error {
	raw, info, err := readConfig(path)
	if err != nil {
		return err
	}
	out, single, err := unchain(raw)
	if err != nil {
		return fmt.Errorf("%s (left untouched): %w", path, err)
	}
	if out == nil {
		return nil
	}
	if single == nil || filepath.Ext(path) != ".conflist" {
		return atomicfile.Swap(path, out, info, info)
	}
	// The .conf comes first, as it went last: the runtime has a
	// configuration at every moment.
	conf := strings.TrimSuffix(path, ".conflist") + ".conf"
	if err := atomicfile.Swap(conf, single, info, nil); err != nil {
		return err
	}
	if err := removeIfSame(path, info); err != nil {
		return fmt.Errorf("remove %s after restoring %s: %w", path, conf, err)
	}
	return nil
}
