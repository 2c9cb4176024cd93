package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRemoveLeftovers: make demo-down must leave no empty directory behind
// (the state root, the CNI socket's mount point), and must never remove
// what another cluster or a real CNI agent still holds.
func TestRemoveLeftovers(t *testing.T) {
	for _, tt := range []struct {
		name string
		// others are files and directories present besides the removed
		// cluster's, relative to the test's root.
		others []string
		// inRoot: the removed cluster's state was under the state root.
		inRoot   bool
		wantGone []string
		wantKept []string
	}{
		{name: "last cluster in the default place", inRoot: true,
			wantGone: []string{"state", "run/canopy"}},
		{name: "another cluster still runs", inRoot: true, others: []string{"state/other/", "run/canopy/cni.sock"},
			wantKept: []string{"state", "run/canopy"}},
		{name: "a cluster with its own directory", inRoot: false,
			wantGone: []string{"run/canopy"}, wantKept: []string{"state"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			p := func(rel string) string { return filepath.Join(top, rel) }
			for _, d := range []string{"state", "run/canopy", "elsewhere"} {
				if err := os.MkdirAll(p(d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, o := range tt.others {
				// A trailing slash names a directory, else a file.
				if strings.HasSuffix(o, "/") {
					if err := os.MkdirAll(p(o), 0o755); err != nil {
						t.Fatal(err)
					}
				} else if err := os.WriteFile(p(o), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dir := p("elsewhere/demo") // already removed by Down
			if tt.inRoot {
				dir = p("state/demo")
			}
			removeLeftovers(dir, p("state"), []string{p("run/canopy")})
			for _, g := range tt.wantGone {
				if _, err := os.Stat(p(g)); !os.IsNotExist(err) {
					t.Errorf("%s is still there", g)
				}
			}
			for _, k := range tt.wantKept {
				if _, err := os.Stat(p(k)); err != nil {
					t.Errorf("%s was removed: %v", k, err)
				}
			}
		})
	}
}
