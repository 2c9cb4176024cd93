package charts

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCRDsMatchPinnedModules copies the CRDs from the pinned modules again
// and compares, so that a bumped pin without make crds (or a hand edit)
// fails.
func TestCRDsMatchPinnedModules(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list; skipped in -short")
	}
	out := t.TempDir()
	cmd := exec.CommandContext(t.Context(), filepath.Join("..", "..", "hack", "crds.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("crds.sh: %v\n%s", err, b)
	}
	fresh, err := filepath.Glob(filepath.Join(out, "*.yaml"))
	if err != nil || len(fresh) == 0 {
		t.Fatalf("no CRDs copied: %v", err)
	}
	for _, f := range fresh {
		want, _ := os.ReadFile(f)
		got, err := fs.ReadFile(Canopy(), "crds/"+filepath.Base(f))
		if err != nil {
			t.Errorf("%s is not committed: run make crds", filepath.Base(f))
			continue
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from the pinned module: run make crds", filepath.Base(f))
		}
	}
}
