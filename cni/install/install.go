// Package install puts the canopy-cni plugin on a node and keeps it there:
// the binary into the CNI bin dir, an entry at the end of the primary
// network configuration's plugin chain, and a watch that puts the entry
// back when another CNI rewrites the file (the way pods silently lose
// redirection after a node reboot).
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// primary returns the configuration file the runtime uses: the first
// .conflist or .conf in name order, as kubelet and containerd pick it.
func (i Installer) primary() (string, error) {
	entries, err := os.ReadDir(i.ConfDir)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", i.ConfDir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext == ".conflist" || ext == ".conf" || ext == ".json" {
			return filepath.Join(i.ConfDir, name), nil
		}
	}
	return "", ErrNoPrimary
}

func (i Installer) entry() map[string]any {
	e := map[string]any{}
	for k, v := range i.Entry {
		e[k] = v
	}
	e["type"] = PluginType
	return e
}

// ensureEntry makes the primary configuration a conflist whose last
// plugin is exactly the entry.
func (i Installer) ensureEntry() error {
	path, err := i.primary()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return fmt.Errorf("%s is not JSON (left untouched): %w", path, err)
	}
	plugins, isList := conf["plugins"].([]any)
	if !isList {
		if _, ok := conf["type"]; !ok {
			return fmt.Errorf("%s has neither plugins nor type (left untouched)", path)
		}
		// A single-plugin .conf becomes a conflist of it.
		single := map[string]any{}
		for k, v := range conf {
			if k != "cniVersion" && k != "name" {
				single[k] = v
			}
		}
		conf = map[string]any{"cniVersion": conf["cniVersion"], "name": conf["name"], "plugins": []any{single}}
		plugins = conf["plugins"].([]any)
	}
	want := i.entry()
	kept := slices.DeleteFunc(slices.Clone(plugins), func(p any) bool {
		m, ok := p.(map[string]any)
		return ok && m["type"] == PluginType
	})
	next := append(kept, any(want))
	if jsonEqual(plugins, next) && isList {
		return nil
	}
	conf["plugins"] = next
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	target := path
	if !isList {
		target = strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	}
	if err := atomicfile.Write(target, append(out, '\n'), 0o644); err != nil {
		return err
	}
	if target != path {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove %s after converting it to %s: %w", path, target, err)
		}
	}
	i.Log.Info("joined the CNI chain", "file", target)
	return nil
}

// InChain returns nil if the runtime runs the plugin for every new pod:
// the primary configuration (the first file, which the runtime uses) is a
// plugin list ending with the entry, and the binary is in BinDir.
// Otherwise it says what is missing.
func (i Installer) InChain() error {
	path, err := i.primary()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return fmt.Errorf("%s is not JSON: %w", path, err)
	}
	plugins, _ := conf["plugins"].([]any)
	if len(plugins) == 0 || !jsonEqual(plugins[len(plugins)-1], i.entry()) {
		return fmt.Errorf("%s does not end with %s", path, PluginType)
	}
	if _, err := os.Stat(filepath.Join(i.BinDir, PluginType)); err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	return nil
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
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

// Uninstall removes the entry and the binary.
func (i Installer) Uninstall() error {
	var errs []error
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
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return fmt.Errorf("%s is not JSON (left untouched): %w", path, err)
	}
	plugins, ok := conf["plugins"].([]any)
	if !ok {
		return nil
	}
	kept := slices.DeleteFunc(slices.Clone(plugins), func(p any) bool {
		m, ok := p.(map[string]any)
		return ok && m["type"] == PluginType
	})
	if len(kept) == len(plugins) {
		return nil
	}
	conf["plugins"] = kept
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(out, '\n'), 0o644)
}
