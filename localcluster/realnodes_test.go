package localcluster

import (
	"os"
	"path/filepath"
	"testing"
)

// TestResolveIn: a node's /var/run is a link to /run, which the kernel,
// asked for /proc/<init>/root/var/run, follows to the host's /run.
func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/canopy", "etc/alt", "usr/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"var/run": "/run", "lib": "usr/lib", "etc/loop": "/etc/loop", "etc/up": "../run"}
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"/var/run/canopy/pods/x.json", "/run/canopy/pods/x.json"},
		{"/lib/xtables", "/usr/lib/xtables"},
		{"/etc/up/canopy", "/run/canopy"},
		{"/etc/cni/net.d", "/etc/cni/net.d"},
		{"/", "/"},
	} {
		got, err := resolveIn(root, tc.in)
		if err != nil {
			t.Errorf("resolveIn(%s): %v", tc.in, err)
			continue
		}
		if want := filepath.Join(root, tc.want); got != want {
			t.Errorf("resolveIn(%s) = %s, want %s", tc.in, got, want)
		}
	}
	if _, err := resolveIn(root, "/etc/loop/x"); err == nil {
		t.Error("a link to itself resolved")
	}
}
