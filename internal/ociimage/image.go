// Package ociimage builds single-layer container images from files on the
// host, without a container engine, so that Canopy's images can be built on
// any machine that has Go. hack/images uses it; Canopy's binaries must not.
//
// Images are reproducible: the same Spec and source bytes give the same
// digest. The layer's tar entries are sorted, owned by root without user
// or group names, and dated Spec.Created, which is also the config's
// creation time. Layer compression is Go's gzip, so the digest holds for
// one Go toolchain; the layer's diff ID holds for every toolchain.
//
// The functions are safe for concurrent use.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one regular file, or symbolic link, of an image.
type File struct {
	// Path is where the file is in the image: absolute and clean, such as
	// /usr/local/bin/canopy-node.
	Path string
	// Source is the file on the host whose bytes the image holds.
	Source string
	// Link, instead of Source, makes the file a symbolic link to Link
	// (a multi-call binary's names, say).
	Link string
	// Mode holds the permission bits in the image, such as 0o755; the
	// host file's own mode is ignored so that a umask cannot change the
	// digest.
	Mode fs.FileMode
}

// Spec describes an image.
type Spec struct {
	Files      []File
	Entrypoint []string
	// User is the image's user, "uid:gid"; empty means root.
	User   string
	Labels map[string]string
	// Arch is the GOARCH the files were built for; the OS is always linux.
	Arch string
	// Created dates the layer's entries and the config, in whole seconds.
	// The zero value means the Unix epoch.
	Created time.Time
}

// dirMode is what Docker gives the directories COPY creates, so an image
// from Build matches one built from the same files by a Dockerfile.
const dirMode = 0o755

// Build returns the image that holds s.Files in one layer. It reads every
// source file before returning, so later changes to them do not reach the
// image.
func Build(s Spec) (v1.Image, error) {
	if s.Arch == "" {
		return nil, errors.New("image spec has no architecture")
	}
	created := s.Created.Truncate(time.Second).UTC()
	if s.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	layerTar, err := buildLayer(s.Files, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("compress the layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "ociimage.Build"},
	})
	if err != nil {
		return nil, fmt.Errorf("add the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = s.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = slices.Clone(s.Entrypoint)
	cf.Config.User = s.User
	cf.Config.Labels = maps.Clone(s.Labels)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the image config: %w", err)
	}
	return img, nil
}

// entry is one tar entry of the layer; data is nil for a directory or a
// link.
type entry struct {
	name string
	mode fs.FileMode
	data []byte
	link string
}

// buildLayer returns the uncompressed layer: files and their parent
// directories, sorted by name so that the order of files does not matter.
func buildLayer(files []File, mtime time.Time) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("image spec has no files")
	}
	entries := map[string]entry{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("image path %q is not an absolute, clean file path", f.Path)
		}
		if f.Mode&^fs.ModePerm != 0 {
			return nil, fmt.Errorf("image file %s: mode %v has more than permission bits", f.Path, f.Mode)
		}
		name := strings.TrimPrefix(f.Path, "/")
		if _, dup := entries[name]; dup {
			return nil, fmt.Errorf("image path %s is given twice", f.Path)
		}
		if f.Link != "" {
			if f.Source != "" {
				return nil, fmt.Errorf("image file %s has both a source and a link", f.Path)
			}
			entries[name] = entry{name: name, mode: 0o777, link: f.Link}
			continue
		}
		data, err := readRegular(f.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Path, err)
		}
		entries[name] = entry{name: name, mode: f.Mode, data: data}
	}
	for name := range entries {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if e, ok := entries[dir]; ok && (e.data != nil || e.link != "") {
				return nil, fmt.Errorf("image path /%s is a file and the directory of /%s", dir, name)
			}
			entries[dir] = entry{name: dir + "/", mode: dirMode}
		}
	}

	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: e.name, Mode: int64(e.mode), ModTime: mtime, Typeflag: tar.TypeDir}
		switch {
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		case e.data != nil:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write layer entry %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("write layer entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("finish the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// readRegular reads a regular file, following symbolic links, because a
// device or directory in the image would not be what the caller meant.
func readRegular(p string) ([]byte, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	return os.ReadFile(p)
}

// ParseSourceDateEpoch returns the time a SOURCE_DATE_EPOCH value names
// (seconds since the Unix epoch), and the epoch itself for "", so that
// builds are reproducible whether or not the variable is set.
func ParseSourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a non-negative number of seconds", v)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// WriteTarball writes img to the file p as a tarball that `docker load`
// and `ctr images import` accept, tagged ref (such as
// canopy/canopy-node:v1.2.0; the tag is required). The file appears
// complete or not at all.
func WriteTarball(p, ref string, img v1.Image) (err error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	// A tarball without an explicit tag would load as :latest, which a
	// versioned build must never claim by accident.
	if !strings.HasSuffix(ref, ":"+tag.TagStr()) {
		return fmt.Errorf("image reference %q has no tag", ref)
	}
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return fmt.Errorf("write image %s: %w", ref, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := tarball.Write(tag, img, f); err != nil {
		return fmt.Errorf("write image %s to %s: %w", ref, p, err)
	}
	// CreateTemp's 0600 would keep the tarball from users who load images.
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write image %s: %w", ref, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write image %s to %s: %w", ref, p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("write image %s: %w", ref, err)
	}
	return nil
}
