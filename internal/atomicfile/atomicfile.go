// Package atomicfile replaces a file in one rename, so a reader (a
// container runtime, the CNI plugin, an agent after a restart) sees either
// the old content or the new, never half of it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrChanged is Swap's error when the file is no longer the one read.
var ErrChanged = errors.New("changed since it was read")

// Write writes data to path with mode through a temporary file in the
// same directory and a rename.
func Write(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Swap puts data at path in one step, like Write, for a file that belongs
// to someone else (another vendor's CNI configuration): the new file gets
// like's permission bits and owner, so that a 0600 file of another user
// stays 0600 and theirs, and it takes path's place only if path is still
// prev (the file read: the same device and inode, and the same size,
// modification and change times, since many writers rewrite a file in
// place), or still absent when prev is nil; otherwise Swap returns
// ErrChanged and leaves path alone, so that a rewrite by the file's owner
// since it was read is not lost. What this cannot see: a rewrite in place
// of the same size within one tick of the kernel's file clock, and a
// rewrite between the check and the rename; the caller's watch on the
// file must put such a change back.
func Swap(path string, data []byte, like, prev os.FileInfo) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// After the rename there is nothing left to remove; after a link the
	// temporary name goes.
	defer os.Remove(tmp.Name())
	if err := fill(tmp, data, like); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if prev == nil {
		// A link fails if path exists, where a rename would replace it.
		if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w", path, ErrChanged)
		} else if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	}
	cur, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !unchanged(cur, prev) {
		return fmt.Errorf("write %s: %w", path, ErrChanged)
	} else if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// unchanged reports whether cur is still the file prev described.
func unchanged(cur, prev os.FileInfo) bool {
	if !os.SameFile(cur, prev) || cur.Size() != prev.Size() || !cur.ModTime().Equal(prev.ModTime()) {
		return false
	}
	c, ok1 := cur.Sys().(*syscall.Stat_t)
	p, ok2 := prev.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && c.Ctim == p.Ctim
}

// fill writes data to f and gives it like's owner, then its permission
// bits (a change of owner clears set-user-ID bits), and syncs it, so that
// a crash after the rename leaves the new content, not an empty file.
func fill(f *os.File, data []byte, like os.FileInfo) error {
	if _, err := f.Write(data); err != nil {
		return err
	}
	want, ok := like.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner in %T", like.Sys())
	}
	got, err := f.Stat()
	if err != nil {
		return err
	}
	// Only a change needs the privilege to chown.
	if have, ok := got.Sys().(*syscall.Stat_t); !ok || have.Uid != want.Uid || have.Gid != want.Gid {
		if err := f.Chown(int(want.Uid), int(want.Gid)); err != nil {
			return err
		}
	}
	if err := f.Chmod(like.Mode().Perm()); err != nil {
		return err
	}
	return f.Sync()
}
