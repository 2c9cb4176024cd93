package install

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const owned = "02-canopy-cni.conflist"

// ownedSetup is setup with Canopy's own configuration file.
func ownedSetup(t *testing.T, files map[string]string) Installer {
	t.Helper()
	i := setup(t, files)
	i.OwnedFile = owned
	return i
}

// TestOwnedFileChainsWithoutTouchingThePrimary: Canopy's own file holds
// the primary's plugins and the entry, comes first, and the primary's file
// stays byte for byte; a primary already chained by an earlier install
// gives no second entry; a single .conf becomes a list.
func TestOwnedFileChainsWithoutTouchingThePrimary(t *testing.T) {
	chained := `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"canopy-cni","agentSocket":"/old"}]}`
	single := `{"cniVersion":"1.0.0","name":"k8s","type":"bridge","bridge":"cni0"}`
	for _, tt := range []struct {
		name, file, body string
		want             []string
	}{
		{"plugin list", "10-bridge.conflist", bridge, []string{"bridge", "portmap", PluginType}},
		{"chained by an earlier install", "10-bridge.conflist", chained, []string{"bridge", PluginType}},
		{"single conf", "10-bridge.conf", single, []string{"bridge", PluginType}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			i := ownedSetup(t, map[string]string{tt.file: tt.body})
			if err := i.InChain(); err == nil {
				t.Error("InChain before Install = nil")
			}
			if err := i.Install(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, types(t, filepath.Join(i.ConfDir, owned))); diff != "" {
				t.Errorf("owned chain (-want +got):\n%s", diff)
			}
			if b, _ := os.ReadFile(filepath.Join(i.ConfDir, tt.file)); string(b) != tt.body {
				t.Errorf("the primary's file changed:\n%s", b)
			}
			if err := i.InChain(); err != nil {
				t.Errorf("InChain after Install: %v", err)
			}
			before, _ := os.Stat(filepath.Join(i.ConfDir, owned))
			if err := i.Install(); err != nil {
				t.Fatal(err)
			}
			if after, _ := os.Stat(filepath.Join(i.ConfDir, owned)); !os.SameFile(before, after) {
				t.Error("a second Install rewrote the owned file")
			}
		})
	}
}

// TestOwnedFileOutlivesThePrimaryRewriting is the node reboot where the
// primary CNI writes its file again before Canopy's agent runs: the
// runtime still takes Canopy's file, which InChain reports stale until
// the agent writes it from the primary's new plugins.
func TestOwnedFileOutlivesThePrimaryRewriting(t *testing.T) {
	i := ownedSetup(t, map[string]string{"10-bridge.conflist": bridge})
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	rewritten := `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"ptp","mtu":1400}]}`
	if err := os.WriteFile(filepath.Join(i.ConfDir, "10-bridge.conflist"), []byte(rewritten), 0o644); err != nil {
		t.Fatal(err)
	}
	if first, err := i.first(""); err != nil || filepath.Base(first) != owned {
		t.Errorf("the runtime uses %s, %v; want %s", first, err, owned)
	}
	if err := i.InChain(); err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("InChain with a stale owned file = %v", err)
	}
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ptp", PluginType}, types(t, filepath.Join(i.ConfDir, owned))); diff != "" {
		t.Errorf("owned chain after the rewrite (-want +got):\n%s", diff)
	}
	// A primary that goes away leaves Canopy's file in place: the runtime
	// keeps failing closed rather than start pods without the plugin.
	if err := os.Remove(filepath.Join(i.ConfDir, "10-bridge.conflist")); err != nil {
		t.Fatal(err)
	}
	if err := i.Install(); !errors.Is(err, ErrNoPrimary) {
		t.Errorf("Install without a primary = %v, want ErrNoPrimary", err)
	}
	if _, err := os.Stat(filepath.Join(i.ConfDir, owned)); err != nil {
		t.Errorf("owned file gone with the primary: %v", err)
	}
}

// TestWatchRewritesTheOwnedFile: the watch follows the primary's changes.
func TestWatchRewritesTheOwnedFile(t *testing.T) {
	i := ownedSetup(t, map[string]string{"10-bridge.conflist": bridge})
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- i.Watch(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(i.ConfDir, "10-bridge.conflist"), []byte(`{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"ptp"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for i.InChain() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("owned file not rewritten: %v", i.InChain())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOwnedFileRefusesWhatTheRuntimeWouldNotUse(t *testing.T) {
	for _, tt := range []struct{ name, owned, primary, want string }{
		{"sorts after the primary", "20-canopy-cni.conflist", "10-bridge.conflist", "does not sort before"},
		{"not a conflist", "02-canopy-cni.conf", "10-bridge.conflist", "want a .conflist"},
		{"a path", "../02-canopy-cni.conflist", "10-bridge.conflist", "want a .conflist"},
		{"hidden", ".02-canopy-cni.conflist", "10-bridge.conflist", "want a .conflist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			i := setup(t, map[string]string{tt.primary: bridge})
			i.OwnedFile = tt.owned
			if err := i.Install(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Install = %v, want %q", err, tt.want)
			}
			if got := snapshot(t, i.ConfDir); len(got) != 1 {
				t.Errorf("files after a refused Install: %v", got)
			}
		})
	}
}

func TestOwnedFileUninstall(t *testing.T) {
	i := ownedSetup(t, map[string]string{"10-bridge.conflist": bridge})
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"10-bridge.conflist": bridge}, snapshot(t, i.ConfDir)); diff != "" {
		t.Errorf("configuration after Uninstall (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(i.BinDir, PluginType)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("binary after Uninstall: %v", err)
	}
}
