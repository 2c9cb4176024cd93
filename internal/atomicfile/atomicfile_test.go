package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "record.json")
	for _, content := range []string{"first", "second, longer"} {
		if err := Write(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, %v; want 0640", st.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the directory, want only the record (no temporary left)", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil, 0o644); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}

// TestSwap: a swapped file keeps the mode and owner of the one it
// replaces, and is not put in place over a file that changed since.
func TestSwap(t *testing.T) {
	t.Parallel()
	// Another user's file, where the test may give it one.
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 4242, 4343
	}
	for _, tt := range []struct {
		name string
		// before makes path and returns what the caller read (nil: none).
		before func(t *testing.T, path string) os.FileInfo
		// meanwhile changes path after it was read.
		meanwhile   func(t *testing.T, path string)
		wantErr     error
		wantContent string // "" with wantErr: path as before, or absent
	}{
		{name: "replaced, mode and owner kept", before: existing("old", 0o600, uid, gid), wantContent: "new"},
		{name: "created", before: func(*testing.T, string) os.FileInfo { return nil }, wantContent: "new"},
		{
			name: "created meanwhile", before: func(*testing.T, string) os.FileInfo { return nil },
			meanwhile: func(t *testing.T, path string) { existing("theirs", 0o644, os.Getuid(), os.Getgid())(t, path) },
			wantErr:   ErrChanged, wantContent: "theirs",
		},
		{
			name: "rewritten meanwhile", before: existing("old", 0o600, uid, gid),
			meanwhile: func(t *testing.T, path string) {
				if err := Write(path, []byte("theirs"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: ErrChanged, wantContent: "theirs",
		},
		{
			// The primary's own writer may truncate and write the same
			// file (os.WriteFile, cp): same inode, new content.
			name: "rewritten in place meanwhile", before: existing("old", 0o600, uid, gid),
			meanwhile: func(t *testing.T, path string) {
				if err := os.WriteFile(path, []byte("theirs"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: ErrChanged, wantContent: "theirs",
		},
		{
			name: "removed meanwhile", before: existing("old", 0o600, uid, gid),
			meanwhile: func(t *testing.T, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: ErrChanged,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, "10-primary.conflist")
			prev := tt.before(t, path)
			like := prev
			if like == nil {
				like = existing("like", 0o640, uid, gid)(t, filepath.Join(dir, "like"))
			}
			if tt.meanwhile != nil {
				tt.meanwhile(t, path)
			}
			err := Swap(path, []byte("new"), like, prev)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Swap() = %v, want %v", err, tt.wantErr)
			}
			got, rerr := os.ReadFile(path)
			if tt.wantContent == "" {
				if !errors.Is(rerr, os.ErrNotExist) {
					t.Errorf("path holds %q, %v; want it absent", got, rerr)
				}
			} else if string(got) != tt.wantContent {
				t.Errorf("path holds %q, %v; want %q", got, rerr, tt.wantContent)
			}
			if tt.wantErr == nil {
				st, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				s := st.Sys().(*syscall.Stat_t)
				want := [3]uint32{uint32(like.Mode().Perm()), uint32(uid), uint32(gid)}
				if diff := cmp.Diff(want, [3]uint32{uint32(st.Mode().Perm()), s.Uid, s.Gid}); diff != "" {
					t.Errorf("mode, uid, gid (-want +got):\n%s", diff)
				}
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("temporary file %s left", e.Name())
				}
			}
		})
	}
}

// existing writes a file with mode and owner and returns what reading it
// gives.
func existing(content string, mode os.FileMode, uid, gid int) func(t *testing.T, path string) os.FileInfo {
	return func(t *testing.T, path string) os.FileInfo {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
}
