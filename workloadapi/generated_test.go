package workloadapi_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates the Go code from proto/ into a
// temporary directory and compares it with the committed files, so that an
// edited .proto without make proto (or a hand-edited .pb.go) fails the build.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("regenerates protos; skipped in -short")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "gen-proto.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-proto: %v\n%s", err, b)
	}

	generated := map[string]bool{}
	err = filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(out, path)
		if err != nil {
			return err
		}
		generated[rel] = true
		fresh, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		committed, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s is generated but not committed: run make proto", rel)
			return nil
		}
		if string(fresh) != string(committed) {
			t.Errorf("%s differs from a fresh generation: run make proto", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) == 0 {
		t.Fatal("gen-proto generated nothing")
	}

	// A .pb.go whose .proto was deleted must go too.
	committed, err := filepath.Glob(filepath.Join(root, "workloadapi", "*", "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	top, _ := filepath.Glob(filepath.Join(root, "workloadapi", "*.pb.go"))
	echo, _ := filepath.Glob(filepath.Join(root, "internal", "echogrpc", "echopb", "*.pb.go"))
	for _, path := range append(append(committed, top...), echo...) {
		rel, _ := filepath.Rel(root, path)
		if !generated[rel] {
			t.Errorf("%s is committed but no longer generated: delete it", rel)
		}
	}
}
