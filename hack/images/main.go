// Command images builds Canopy's images from the static binaries of make
// build, without a container engine, and writes each as <repository>.tar,
// which docker load and ctr images import accept. make images runs it.
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
}

// canopyImages is the image table.
func canopyImages() []image {
	return []image{
		{repo: "canopy-controller", binaries: []string{"canopy-controller"}},
		{repo: "canopy-node", binaries: []string{"canopy-node"}},
		// The agent installs the plugin from beside itself onto the node.
		{repo: "canopy-cni-agent", binaries: []string{"canopy-cni-agent", "canopy-cni"}},
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
	created               time.Time
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	flags := flag.NewFlagSet("images", flag.ContinueOnError)
	flags.StringVar(&c.binDir, "bin-dir", "", "the directory of the static binaries that make build wrote")
	flags.StringVar(&c.out, "out", "", "the directory to write <repository>.tar to")
	flags.StringVar(&c.hub, "hub", "canopy", "the images' repository prefix")
	flags.StringVar(&c.tag, "tag", "dev", "the images' tag, normally the version")
	if err := flags.Parse(args); err != nil {
		return config{}, err
	}
	if flags.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", flags.Args())
	}
	if c.binDir == "" || c.out == "" {
		return config{}, errors.New("--bin-dir and --out are required")
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
		digest, size, err := writeImage(cfg, im, ref, p)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f MiB\n", ref, digest, float64(size)/(1<<20))
	}
	return tw.Flush()
}

func writeImage(cfg config, im image, ref, p string) (digest string, size int64, err error) {
	spec := ociimage.Spec{Entrypoint: im.entrypoint(), Labels: im.labels(cfg.tag), Created: cfg.created}
	for _, b := range im.binaries {
		src := filepath.Join(cfg.binDir, b)
		arch, err := goarch(src)
		if err != nil {
			return "", 0, err
		}
		if spec.Arch != "" && arch != spec.Arch {
			return "", 0, fmt.Errorf("%s is built for %s, the image's other binaries for %s", src, arch, spec.Arch)
		}
		spec.Arch = arch
		spec.Files = append(spec.Files, ociimage.File{Path: binDir + "/" + b, Source: src, Mode: 0o755})
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		return "", 0, err
	}
	if err := ociimage.WriteTarball(p, ref, img); err != nil {
		return "", 0, err
	}
	d, err := img.Digest()
	if err != nil {
		return "", 0, fmt.Errorf("digest: %w", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", 0, err
	}
	return d.String(), fi.Size(), nil
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
