package main

import (
	"bufio"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// dockerfile is what a test checks of a Dockerfile.
type dockerfile struct {
	From       string
	Labels     map[string]string
	CopySrc    []string
	CopyDest   string
	Entrypoint []string
}

// parseDockerfile reads the few instructions Canopy's Dockerfiles use.
func parseDockerfile(t *testing.T, p string) dockerfile {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch instr {
		case "FROM":
			d.From = rest
		case "ARG":
		case "LABEL":
			d.Labels = map[string]string{}
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				d.Labels[k] = strings.Trim(v, `"`)
			}
		case "COPY":
			args := strings.Fields(rest)
			d.CopySrc, d.CopyDest = args[:len(args)-1], args[len(args)-1]
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.Entrypoint); err != nil {
				t.Fatalf("%s: ENTRYPOINT is not JSON: %v", p, err)
			}
		default:
			t.Errorf("%s: unexpected instruction %s", p, instr)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDockerfilesMatchImages keeps the Dockerfiles and the image table
// describing the same images.
func TestDockerfilesMatchImages(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	images := canopyImages()
	for _, im := range images {
		t.Run(im.repo, func(t *testing.T) {
			t.Parallel()
			got := parseDockerfile(t, filepath.Join(root, "cmd", im.binaries[0], "Dockerfile"))
			slices.Sort(got.CopySrc)
			want := dockerfile{
				From:       "scratch",
				Labels:     im.labels("${VERSION}"),
				CopySrc:    slices.Sorted(slices.Values(im.binaries)),
				CopyDest:   binDir + "/",
				Entrypoint: im.entrypoint(),
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Dockerfile mismatch (-want +got):\n%s", diff)
			}
		})
	}

	files, err := filepath.Glob(filepath.Join(root, "cmd", "*", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		bin := filepath.Base(filepath.Dir(f))
		if !slices.ContainsFunc(images, func(im image) bool { return im.binaries[0] == bin }) {
			t.Errorf("%s has no image in canopyImages", f)
		}
	}
}

func TestRunNamesMissingBinaries(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "canopy-node"), []byte("not a binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := run(config{binDir: dir, out: t.TempDir(), hub: "canopy", tag: "dev"}, nil)
	want := dir + " has no canopy-controller, canopy-cni-agent, canopy-cni, canopy-echo: run make build"
	if err == nil {
		t.Fatalf("run() succeeded, want %q", want)
	}
	if diff := cmp.Diff(want, err.Error()); diff != "" {
		t.Errorf("run() error mismatch (-want +got):\n%s", diff)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		args    []string
		epoch   string
		want    config
		wantErr string
	}{
		{name: "defaults", args: []string{"--bin-dir", "/b", "--out", "/o"},
			want: config{binDir: "/b", out: "/o", hub: "canopy", tag: "dev", created: time.Unix(0, 0).UTC()}},
		{name: "every flag and SOURCE_DATE_EPOCH",
			args:  []string{"--bin-dir", "/b", "--out", "/o", "--hub", "mesh", "--tag", "v1.0.0"},
			epoch: "1700000000",
			want:  config{binDir: "/b", out: "/o", hub: "mesh", tag: "v1.0.0", created: time.Unix(1700000000, 0).UTC()}},
		{name: "no bin dir", args: []string{"--out", "/o"}, wantErr: "--bin-dir and --out are required"},
		{name: "stray argument", args: []string{"--bin-dir", "/b", "--out", "/o", "x"}, wantErr: `unexpected arguments ["x"]`},
		{name: "bad epoch", args: []string{"--bin-dir", "/b", "--out", "/o"}, epoch: "soon",
			wantErr: `SOURCE_DATE_EPOCH "soon" is not a non-negative number of seconds`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseFlags(tt.args, func(k string) string {
				if k == "SOURCE_DATE_EPOCH" {
					return tt.epoch
				}
				return ""
			})
			var gotErr string
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tt.wantErr, gotErr); diff != "" {
				t.Fatalf("parseFlags() error mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("parseFlags() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPushNamesWhatNodesPull: with --push, every image lands in the
// registry under the names the chart, deploy/examples and the injector
// use, pullable as pushed.
func TestPushNamesWhatNodesPull(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	// Any static Go program stands in for each binary.
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "prog"), "../../cmd/canopy-pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build a static program: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(filepath.Join(bin, "prog"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"canopy-controller", "canopy-node", "canopy-cni-agent", "canopy-cni", "canopy-echo", "pilot-agent"} {
		if err := os.WriteFile(filepath.Join(bin, b), prog, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	err = run(config{binDir: bin, out: t.TempDir(), hub: "canopy", tag: "v9", push: host,
		pilotAgent: filepath.Join(bin, "pilot-agent"), created: time.Unix(0, 0)}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"canopy/canopy-controller:v9", "canopy/canopy-node:v9", "canopy/canopy-cni-agent:v9",
		"canopy/echo:v9", "canopy/echo:latest", "istio/proxyv2:1.32.0"} {
		r, err := name.ParseReference(host+"/"+ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(r)
		if err != nil {
			t.Errorf("%s: %v", ref, err)
			continue
		}
		cf, err := img.ConfigFile()
		if err != nil || len(cf.Config.Entrypoint) == 0 {
			t.Errorf("%s: no entrypoint (%v)", ref, err)
		}
	}
}
