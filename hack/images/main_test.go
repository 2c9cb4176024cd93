package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/canopy-mesh/canopy/internal/ociimage"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

// dockerfile is what a test checks of a Dockerfile.
type dockerfile struct {
	From       string
	Labels     map[string]string
	CopySrc    []string
	CopyDest   string
	Entrypoint []string
	// CopyFrom are the final stage's COPY --from=<stage> lines, as
	// "<stage> <src> <dest>".
	CopyFrom []string
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
	continued := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		// A RUN's continuation lines belong to a build stage's RUN.
		wasContinued := continued
		continued = strings.HasSuffix(line, "\\")
		if wasContinued || line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		if from, ok := strings.CutPrefix(rest, "--from="); ok && instr == "COPY" {
			d.CopyFrom = append(d.CopyFrom, strings.Join(strings.Fields(from), " "))
			continue
		}
		switch instr {
		case "FROM":
			// Each stage starts afresh: the final one is the image.
			d = dockerfile{From: rest}
		case "RUN":
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
			if im.iptables {
				want.CopyFrom = []string{"iptables /out/ /"}
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

// TestAgentImageRunsIptables: the CNI agent's image runs what its iptables
// backend execs. Its files alone (no host file system) are unpacked and
// iptables-restore, by each name the backend uses, parses rules with the
// extensions the capture rules name, in a network namespace of its own.
// The image was FROM scratch with two Go binaries before: "no such file".
func TestAgentImageRunsIptables(t *testing.T) {
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "chroot needs root")
	}
	files, err := iptablesFiles("/", runtime.GOARCH)
	if err != nil {
		ci.Unavailable(t, "%v", err)
	}
	img, err := ociimage.Build(ociimage.Spec{Files: files, Arch: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, fs.FileMode(h.Mode))
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	rules := "*mangle\n:PREROUTING ACCEPT [0:0]\n" +
		"-A PREROUTING -p tcp -m mark --mark 0x111/0xfff -m socket --transparent -j TPROXY --on-port 15006 --tproxy-mark 0x111/0xfff\n" +
		"-A PREROUTING -m conntrack --ctstate RELATED,ESTABLISHED -j CONNMARK --restore-mark\nCOMMIT\n"
	for _, cmd := range []string{"iptables-restore", "ip6tables-restore"} {
		c := exec.Command("unshare", "--net", "chroot", dir, "/usr/sbin/"+cmd, "--test")
		c.Stdin = strings.NewReader(rules)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("%s in the agent's image: %v\n%s", cmd, err, out)
		}
	}
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		if out, err := exec.Command("unshare", "--net", "chroot", dir, "/usr/sbin/"+cmd).CombinedOutput(); err != nil {
			t.Errorf("%s in the agent's image: %v\n%s", cmd, err, out)
		}
	}
}

// TestIptablesOfAnotherArchitectureIsRefused: the build machine's iptables
// never goes into an image for another architecture, where it could not run.
func TestIptablesOfAnotherArchitectureIsRefused(t *testing.T) {
	if _, err := iptablesFiles("/", runtime.GOARCH); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if other == "" {
		t.Skipf("no other architecture known for %s", runtime.GOARCH)
	}
	if _, err := iptablesFiles("/", other); err == nil || !strings.Contains(err.Error(), "is for") {
		t.Errorf("iptablesFiles for %s on %s = %v, want a refusal naming the architectures", other, runtime.GOARCH, err)
	}
}
