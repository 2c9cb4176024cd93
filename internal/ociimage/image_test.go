package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// writeFiles creates files named by the keys of contents in a temporary
// directory and returns the directory.
func writeFiles(t *testing.T, contents map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for n, c := range contents {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// baseSpec is an image of two files of dir ("agent" and "plugin").
func baseSpec(dir string) Spec {
	return Spec{
		Files: []File{
			{Path: "/usr/local/bin/agent", Source: filepath.Join(dir, "agent"), Mode: 0o755},
			{Path: "/usr/local/bin/plugin", Source: filepath.Join(dir, "plugin"), Mode: 0o755},
		},
		Entrypoint: []string{"/usr/local/bin/agent"},
		Labels:     map[string]string{"org.opencontainers.image.version": "v1", "org.opencontainers.image.title": "agent"},
		Arch:       "amd64",
	}
}

func mustDigest(t *testing.T, s Spec) v1.Hash {
	t.Helper()
	img, err := Build(s)
	if err != nil {
		t.Fatalf("Build() error: %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("Digest() error: %v", err)
	}
	return d
}

func TestBuildDigest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// change alters a copy of the base spec, or the files it reads.
		change   func(t *testing.T, s *Spec)
		wantSame bool
	}{
		{name: "same inputs", change: func(*testing.T, *Spec) {}, wantSame: true},
		{name: "files in another order", change: func(_ *testing.T, s *Spec) {
			s.Files[0], s.Files[1] = s.Files[1], s.Files[0]
		}, wantSame: true},
		{name: "host file mode", change: func(t *testing.T, s *Spec) {
			if err := os.Chmod(s.Files[0].Source, 0o700); err != nil {
				t.Fatal(err)
			}
		}, wantSame: true},
		{name: "host file mtime", change: func(t *testing.T, s *Spec) {
			if err := os.Chtimes(s.Files[0].Source, time.Now(), time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}, wantSame: true},
		{name: "file content", change: func(t *testing.T, s *Spec) {
			if err := os.WriteFile(s.Files[0].Source, []byte("agent v2"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "file mode", change: func(_ *testing.T, s *Spec) { s.Files[1].Mode = 0o555 }},
		{name: "file path", change: func(_ *testing.T, s *Spec) { s.Files[1].Path = "/usr/bin/plugin" }},
		{name: "entrypoint", change: func(_ *testing.T, s *Spec) { s.Entrypoint = []string{"/usr/local/bin/plugin"} }},
		{name: "label", change: func(_ *testing.T, s *Spec) { s.Labels = map[string]string{"org.opencontainers.image.version": "v2"} }},
		{name: "architecture", change: func(_ *testing.T, s *Spec) { s.Arch = "arm64" }},
		{name: "creation time", change: func(_ *testing.T, s *Spec) { s.Created = time.Unix(1700000000, 0) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			contents := map[string]string{"agent": "agent v1", "plugin": "plugin v1"}
			before := mustDigest(t, baseSpec(writeFiles(t, contents)))

			s := baseSpec(writeFiles(t, contents))
			tt.change(t, &s)
			after := mustDigest(t, s)

			if got := before == after; got != tt.wantSame {
				t.Errorf("digests %s and %s: same = %v, want %v", before, after, got, tt.wantSame)
			}
		})
	}
}

// layerEntry is what a test checks of a tar entry.
type layerEntry struct {
	Name       string
	Type       byte
	Mode       int64
	UID, GID   int
	Uname      string
	Gname      string
	ModTime    time.Time
	Content    string
	Linkname   string
	PAXRecords map[string]string
}

func layerEntries(t *testing.T, img v1.Image) []layerEntry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatalf("Layers() error: %v", err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatalf("Uncompressed() error: %v", err)
	}
	defer rc.Close()
	var got []layerEntry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read layer entry %s: %v", h.Name, err)
		}
		got = append(got, layerEntry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid,
			Uname: h.Uname, Gname: h.Gname, ModTime: h.ModTime.UTC(), Content: string(content), Linkname: h.Linkname, PAXRecords: h.PAXRecords})
	}
}

func TestBuildLayer(t *testing.T) {
	t.Parallel()
	epoch := time.Unix(0, 0).UTC()
	dir := writeFiles(t, map[string]string{"agent": "agent bytes", "plugin": "plugin bytes", "conf": "{}"})
	dirEntry := func(name string, mtime time.Time) layerEntry {
		return layerEntry{Name: name, Type: tar.TypeDir, Mode: 0o755, ModTime: mtime}
	}
	for _, tt := range []struct {
		name    string
		files   []File
		created time.Time
		want    []layerEntry
	}{
		{
			name:  "one binary",
			files: []File{{Path: "/usr/local/bin/agent", Source: filepath.Join(dir, "agent"), Mode: 0o755}},
			want: []layerEntry{
				dirEntry("usr/", epoch), dirEntry("usr/local/", epoch), dirEntry("usr/local/bin/", epoch),
				{Name: "usr/local/bin/agent", Type: tar.TypeReg, Mode: 0o755, ModTime: epoch, Content: "agent bytes"},
			},
		},
		{
			name: "files in several directories, sorted",
			files: []File{
				{Path: "/usr/local/bin/plugin", Source: filepath.Join(dir, "plugin"), Mode: 0o555},
				{Path: "/etc/agent.json", Source: filepath.Join(dir, "conf"), Mode: 0o644},
				{Path: "/usr/local/bin/agent", Source: filepath.Join(dir, "agent"), Mode: 0o755},
			},
			want: []layerEntry{
				dirEntry("etc/", epoch),
				{Name: "etc/agent.json", Type: tar.TypeReg, Mode: 0o644, ModTime: epoch, Content: "{}"},
				dirEntry("usr/", epoch), dirEntry("usr/local/", epoch), dirEntry("usr/local/bin/", epoch),
				{Name: "usr/local/bin/agent", Type: tar.TypeReg, Mode: 0o755, ModTime: epoch, Content: "agent bytes"},
				{Name: "usr/local/bin/plugin", Type: tar.TypeReg, Mode: 0o555, ModTime: epoch, Content: "plugin bytes"},
			},
		},
		{
			name: "a multi-call binary's names as links",
			files: []File{
				{Path: "/usr/sbin/multi", Source: filepath.Join(dir, "agent"), Mode: 0o755},
				{Path: "/usr/sbin/restore", Link: "multi"},
			},
			want: []layerEntry{
				dirEntry("usr/", epoch), dirEntry("usr/sbin/", epoch),
				{Name: "usr/sbin/multi", Type: tar.TypeReg, Mode: 0o755, ModTime: epoch, Content: "agent bytes"},
				{Name: "usr/sbin/restore", Type: tar.TypeSymlink, Mode: 0o777, ModTime: epoch, Linkname: "multi"},
			},
		},
		{
			name:    "creation time, truncated to seconds",
			files:   []File{{Path: "/agent", Source: filepath.Join(dir, "agent"), Mode: 0o700}},
			created: time.Unix(1700000000, 999),
			want: []layerEntry{
				{Name: "agent", Type: tar.TypeReg, Mode: 0o700, ModTime: time.Unix(1700000000, 0).UTC(), Content: "agent bytes"},
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			img, err := Build(Spec{Files: tt.files, Arch: "amd64", Created: tt.created})
			if err != nil {
				t.Fatalf("Build() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, layerEntries(t, img)); diff != "" {
				t.Errorf("layer mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// configView is what a test checks of an image config.
type configView struct {
	OS, Architecture string
	Created          time.Time
	Entrypoint       []string
	Labels           map[string]string
	DiffIDs          int
}

func TestBuildConfig(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"agent": "a", "plugin": "p"})
	for _, tt := range []struct {
		name   string
		change func(*Spec)
		want   configView
	}{
		{
			name:   "base",
			change: func(*Spec) {},
			want: configView{OS: "linux", Architecture: "amd64", Created: time.Unix(0, 0).UTC(),
				Entrypoint: []string{"/usr/local/bin/agent"},
				Labels:     map[string]string{"org.opencontainers.image.version": "v1", "org.opencontainers.image.title": "agent"},
				DiffIDs:    1},
		},
		{
			name: "arm64, dated, no labels",
			change: func(s *Spec) {
				s.Arch, s.Created, s.Labels = "arm64", time.Unix(1700000000, 0), nil
			},
			want: configView{OS: "linux", Architecture: "arm64", Created: time.Unix(1700000000, 0).UTC(),
				Entrypoint: []string{"/usr/local/bin/agent"}, DiffIDs: 1},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := baseSpec(dir)
			tt.change(&s)
			img, err := Build(s)
			if err != nil {
				t.Fatalf("Build() error: %v", err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatalf("ConfigFile() error: %v", err)
			}
			got := configView{OS: cf.OS, Architecture: cf.Architecture, Created: cf.Created.UTC(),
				Entrypoint: cf.Config.Entrypoint, Labels: cf.Config.Labels, DiffIDs: len(cf.RootFS.DiffIDs)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"agent": "a"})
	agent := filepath.Join(dir, "agent")
	for _, tt := range []struct {
		name       string
		spec       Spec
		wantErr    string
		wantNotExt bool // errors.Is(err, fs.ErrNotExist)
	}{
		{name: "missing source",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "/bin/x", Source: filepath.Join(dir, "nope"), Mode: 0o755}}},
			wantErr: "image file /bin/x: stat " + filepath.Join(dir, "nope") + ": no such file or directory", wantNotExt: true},
		{name: "source is a directory",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "/bin/x", Source: dir, Mode: 0o755}}},
			wantErr: "image file /bin/x: " + dir + " is not a regular file"},
		{name: "no files", spec: Spec{Arch: "amd64"}, wantErr: "image spec has no files"},
		{name: "no architecture",
			spec:    Spec{Files: []File{{Path: "/bin/x", Source: agent, Mode: 0o755}}},
			wantErr: "image spec has no architecture"},
		{name: "relative path",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "bin/x", Source: agent, Mode: 0o755}}},
			wantErr: `image path "bin/x" is not an absolute, clean file path`},
		{name: "unclean path",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "/bin/../x", Source: agent, Mode: 0o755}}},
			wantErr: `image path "/bin/../x" is not an absolute, clean file path`},
		{name: "root",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "/", Source: agent, Mode: 0o755}}},
			wantErr: `image path "/" is not an absolute, clean file path`},
		{name: "path twice",
			spec: Spec{Arch: "amd64", Files: []File{
				{Path: "/bin/x", Source: agent, Mode: 0o755}, {Path: "/bin/x", Source: agent, Mode: 0o644}}},
			wantErr: "image path /bin/x is given twice"},
		{name: "file and directory",
			spec: Spec{Arch: "amd64", Files: []File{
				{Path: "/bin", Source: agent, Mode: 0o755}, {Path: "/bin/x", Source: agent, Mode: 0o755}}},
			wantErr: "image path /bin is a file and the directory of /bin/x"},
		{name: "mode with a type",
			spec:    Spec{Arch: "amd64", Files: []File{{Path: "/bin/x", Source: agent, Mode: fs.ModeSymlink | 0o777}}},
			wantErr: "image file /bin/x: mode Lrwxrwxrwx has more than permission bits"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Build(tt.spec)
			if err == nil {
				t.Fatal("Build() succeeded, want an error")
			}
			if diff := cmp.Diff(tt.wantErr, err.Error()); diff != "" {
				t.Errorf("Build() error mismatch (-want +got):\n%s", diff)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.wantNotExt {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, tt.wantNotExt)
			}
		})
	}
}

func TestWriteTarball(t *testing.T) {
	t.Parallel()
	img, err := Build(baseSpec(writeFiles(t, map[string]string{"agent": "a", "plugin": "p"})))
	if err != nil {
		t.Fatalf("Build() error: %v", err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, ref string
	}{
		{name: "version tag", ref: "canopy/canopy-node:v1.2.0-3-gabcdef0"},
		{name: "dev tag", ref: "canopy/echo:dev"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			p := filepath.Join(out, "image.tar")
			if err := WriteTarball(p, tt.ref, img); err != nil {
				t.Fatalf("WriteTarball() error: %v", err)
			}

			tag, err := name.NewTag(tt.ref)
			if err != nil {
				t.Fatal(err)
			}
			back, err := tarball.ImageFromPath(p, &tag)
			if err != nil {
				t.Fatalf("ImageFromPath() error: %v", err)
			}
			got, err := back.Digest()
			if err != nil {
				t.Fatalf("Digest() of the read image: %v", err)
			}
			if got != want {
				t.Errorf("read-back digest = %s, want %s", got, want)
			}

			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
			if err != nil {
				t.Fatalf("LoadManifest() error: %v", err)
			}
			var tags [][]string
			for _, d := range m {
				tags = append(tags, d.RepoTags)
			}
			if diff := cmp.Diff([][]string{{tt.ref}}, tags); diff != "" {
				t.Errorf("RepoTags mismatch (-want +got):\n%s", diff)
			}

			// Writing again gives the same bytes, and leaves no temporary file.
			first, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteTarball(p, tt.ref, img); err != nil {
				t.Fatalf("second WriteTarball() error: %v", err)
			}
			second, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Error("two tarballs of one image differ")
			}
			entries, err := os.ReadDir(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 {
				t.Errorf("output directory holds %d entries, want only image.tar", len(entries))
			}
		})
	}
}

func TestWriteTarballErrors(t *testing.T) {
	t.Parallel()
	img, err := Build(baseSpec(writeFiles(t, map[string]string{"agent": "a", "plugin": "p"})))
	if err != nil {
		t.Fatalf("Build() error: %v", err)
	}
	for _, tt := range []struct {
		name, ref string
		dir       string
		wantErr   string
	}{
		{name: "no tag", ref: "canopy/canopy-node", dir: t.TempDir(),
			wantErr: `image reference "canopy/canopy-node" has no tag`},
		{name: "no such directory", ref: "canopy/canopy-node:dev", dir: "/nonexistent/dir",
			wantErr: "write image canopy/canopy-node:dev: open /nonexistent/dir/.image.tar."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := WriteTarball(filepath.Join(tt.dir, "image.tar"), tt.ref, img)
			if err == nil {
				t.Fatal("WriteTarball() succeeded, want an error")
			}
			if got := err.Error(); !strings.HasPrefix(got, tt.wantErr) {
				t.Errorf("WriteTarball() error = %q, want it to start with %q", got, tt.wantErr)
			}
		})
	}
}

func TestParseSourceDateEpoch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{in: "", want: time.Unix(0, 0).UTC()},
		{in: "0", want: time.Unix(0, 0).UTC()},
		{in: "1700000000", want: time.Unix(1700000000, 0).UTC()},
		{in: "-1", wantErr: true},
		{in: "yesterday", wantErr: true},
		{in: "1.5", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseSourceDateEpoch(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseSourceDateEpoch(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseSourceDateEpoch(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}
