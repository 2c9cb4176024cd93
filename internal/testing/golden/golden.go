// Package golden compares test output with files under testdata and, run
// as go test -update, rewrites them: a change of output shows up in review
// as a diff of readable files.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the -update flag of every test binary that links this package.
var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// Check compares got with testdata/<name>, after rewriting the file with
// got under -update (creating directories as needed).
func Check(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update if intended):\n%s", path, diff)
	}
}
