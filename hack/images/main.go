// Command images builds Canopy's images from the static binaries of make
// build, without a container engine, and writes each as <repository>.tar,
// which docker load and ctr images import accept. make images runs it.
//
// With --push REGISTRY it also pushes each to REGISTRY/<hub>/<repository>:<tag>
// (plain HTTP for a private or loopback address), the echo app also as
// REGISTRY/canopy/echo:latest (the name deploy/examples use), and with
// --pilot-agent, Istio's pilot-agent as the proxyv2 image the chart's
// injector names (REGISTRY/<injection.proxy.hub>/proxyv2:<tag>, from the
// chart's values): the local cluster's real nodes pull all of these.
//
// The images are reproducible: the same binaries, tag and
// SOURCE_DATE_EPOCH (default: the Unix epoch) give the same digests.
package main

import (
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/canopy-mesh/canopy/deploy/charts"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/ociimage"
)

// binDir is where the binaries live in every image; the Dockerfiles COPY
// them there too.
const binDir = "/usr/local/bin"

// image is one of Canopy's images.
type image struct {
	// repo is the repository under the hub.
	repo string
	// binaries go to binDir. The first is the entrypoint, and
	// cmd/<first>/Dockerfile describes the same image for Docker users.
	binaries []string
	// iptables adds iptables (iptablesFiles): a program the image runs.
	iptables bool
}

// canopyImages is the image table.
func canopyImages() []image {
	return []image{
		{repo: "canopy-controller", binaries: []string{"canopy-controller"}},
		{repo: "canopy-node", binaries: []string{"canopy-node"}},
		// The agent installs the plugin from beside itself onto the node.
		// Its iptables backend runs iptables-restore and iptables-save.
		{repo: "canopy-cni-agent", binaries: []string{"canopy-cni-agent", "canopy-cni"}, iptables: true},
		// deploy/examples and the local cluster already call the sample
		// app canopy/echo.
		{repo: "echo", binaries: []string{"canopy-echo"}},
	}
}

func (im image) entrypoint() []string { return []string{binDir + "/" + im.binaries[0]} }

// labels are the image's labels; the Dockerfiles set the same ones.
func (im image) labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":   im.binaries[0],
		"org.opencontainers.image.version": version,
	}
}

type config struct {
	binDir, out, hub, tag string
	// push is the registry (host:port) to push to; pilotAgent Istio's
	// agent binary for the proxyv2 image.
	push, pilotAgent string
	created          time.Time
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	flags := flag.NewFlagSet("images", flag.ContinueOnError)
	flags.StringVar(&c.binDir, "bin-dir", "", "the directory of the static binaries that make build wrote")
	flags.StringVar(&c.out, "out", "", "the directory to write <repository>.tar to")
	flags.StringVar(&c.hub, "hub", "canopy", "the images' repository prefix")
	flags.StringVar(&c.tag, "tag", "dev", "the images' tag, normally the version")
	flags.StringVar(&c.push, "push", "", "also push the images to this registry (host:port)")
	flags.StringVar(&c.pilotAgent, "pilot-agent", "", "with --push: Istio's pilot-agent binary, pushed as the injector's proxyv2 image")
	if err := flags.Parse(args); err != nil {
		return config{}, err
	}
	if flags.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", flags.Args())
	}
	if c.binDir == "" || c.out == "" {
		return config{}, errors.New("--bin-dir and --out are required")
	}
	if c.pilotAgent != "" && c.push == "" {
		return config{}, errors.New("--pilot-agent needs --push")
	}
	var err error
	if c.created, err = ociimage.ParseSourceDateEpoch(getenv("SOURCE_DATE_EPOCH")); err != nil {
		return config{}, err
	}
	return c, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// run builds and writes every image, then prints each one's reference,
// digest and tarball size to w.
func run(cfg config, w io.Writer) error {
	images := canopyImages()
	if err := checkBinaries(cfg.binDir, images); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return fmt.Errorf("create the output directory: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, im := range images {
		ref := cfg.hub + "/" + im.repo + ":" + cfg.tag
		p := filepath.Join(cfg.out, im.repo+".tar")
		img, size, err := writeImage(cfg, im, ref, p)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return fmt.Errorf("image %s: digest: %w", ref, err)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f MiB\n", ref, digest, float64(size)/(1<<20))
		if cfg.push == "" {
			continue
		}
		refs := []string{cfg.push + "/" + ref}
		if im.repo == "echo" {
			refs = append(refs, cfg.push+"/canopy/echo:latest")
		}
		for _, r := range refs {
			if err := push(r, img); err != nil {
				return err
			}
			fmt.Fprintf(tw, "pushed %s\n", r)
		}
	}
	if cfg.pilotAgent != "" {
		ref, err := pushProxyv2(cfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "pushed %s\n", ref)
	}
	return tw.Flush()
}

// push writes img to the registry under ref.
func push(ref string, img v1.Image) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	if err := remote.Write(r, img); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// pushProxyv2 pushes Istio's pilot-agent as the proxyv2 image the chart's
// injector puts in pods (without Envoy: the local cluster runs it for
// proxyless gRPC only), where Istio's own image has it.
func pushProxyv2(cfg config) (string, error) {
	b, err := fs.ReadFile(charts.Canopy(), "values.yaml")
	if err != nil {
		return "", err
	}
	values, err := chart.ParseValues(b)
	if err != nil {
		return "", err
	}
	hub, _, _ := unstructured.NestedString(values, "injection", "proxy", "hub")
	tag, _, _ := unstructured.NestedString(values, "injection", "proxy", "tag")
	if hub == "" || tag == "" {
		return "", errors.New("the chart's values name no injection.proxy.hub and tag")
	}
	arch, err := goarch(cfg.pilotAgent)
	if err != nil {
		return "", err
	}
	img, err := ociimage.Build(ociimage.Spec{
		Files:      []ociimage.File{{Path: binDir + "/pilot-agent", Source: cfg.pilotAgent, Mode: 0o755}},
		Entrypoint: []string{binDir + "/pilot-agent"},
		Arch:       arch,
		Created:    cfg.created,
	})
	if err != nil {
		return "", fmt.Errorf("proxyv2 image: %w", err)
	}
	ref := cfg.push + "/" + hub + "/proxyv2:" + tag
	return ref, push(ref, img)
}

func writeImage(cfg config, im image, ref, p string) (_ v1.Image, size int64, err error) {
	spec := ociimage.Spec{Entrypoint: im.entrypoint(), Labels: im.labels(cfg.tag), Created: cfg.created}
	for _, b := range im.binaries {
		src := filepath.Join(cfg.binDir, b)
		arch, err := goarch(src)
		if err != nil {
			return nil, 0, err
		}
		if spec.Arch != "" && arch != spec.Arch {
			return nil, 0, fmt.Errorf("%s is built for %s, the image's other binaries for %s", src, arch, spec.Arch)
		}
		spec.Arch = arch
		spec.Files = append(spec.Files, ociimage.File{Path: binDir + "/" + b, Source: src, Mode: 0o755})
	}
	if im.iptables {
		files, err := iptablesFiles("/", spec.Arch)
		if err != nil {
			return nil, 0, err
		}
		spec.Files = append(spec.Files, files...)
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		return nil, 0, err
	}
	if err := ociimage.WriteTarball(p, ref, img); err != nil {
		return nil, 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, 0, err
	}
	return img, fi.Size(), nil
}

// checkBinaries names every missing binary at once, so one make build
// fixes them all.
func checkBinaries(dir string, images []image) error {
	var missing []string
	for _, im := range images {
		for _, b := range im.binaries {
			_, err := os.Stat(filepath.Join(dir, b))
			if errors.Is(err, fs.ErrNotExist) {
				missing = append(missing, b)
			} else if err != nil {
				return fmt.Errorf("binary %s: %w", b, err)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s has no %s: run make build", dir, strings.Join(missing, ", "))
	}
	return nil
}

// goarch returns the architecture a Go binary was built for, refusing a
// binary that would not run on a scratch image: not for Linux, or linked
// against the C library.
func goarch(p string) (string, error) {
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read the build information of %s (run make build): %w", p, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if goos := settings["GOOS"]; goos != "linux" {
		return "", fmt.Errorf("%s is built for %s, not linux", p, goos)
	}
	if settings["CGO_ENABLED"] != "0" {
		return "", fmt.Errorf("%s is not static (built with cgo), so it cannot run on a scratch image: run make build", p)
	}
	return settings["GOARCH"], nil
}
