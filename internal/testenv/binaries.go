package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrUnavailable is wrapped by Start's error when a prerequisite is missing
// (etcd, or the Kubernetes binaries), as opposed to a component that failed.
var ErrUnavailable = errors.New("test environment unavailable")

// Environment variables that point the environment at its binaries.
const (
	// EnvKubeBinDir names a directory holding kube-apiserver and
	// kube-controller-manager; make test sets it.
	EnvKubeBinDir = "CANOPY_KUBE_BIN_DIR"
	// EnvEtcd names the etcd binary; default: etcd on PATH.
	EnvEtcd = "CANOPY_ETCD"
)

const modulePath = "github.com/canopy-mesh/canopy"

// binaries are the absolute paths of the programs an environment runs.
type binaries struct {
	etcd, apiserver, controllerManager string
}

func findBinaries(opts Options) (binaries, error) {
	etcd := firstNonEmpty(opts.Etcd, os.Getenv(EnvEtcd), "etcd")
	etcd, err := exec.LookPath(etcd)
	if err != nil {
		return binaries{}, fmt.Errorf("%w: etcd: %w (install Debian etcd-server: make deps)", ErrUnavailable, err)
	}
	dir := firstNonEmpty(opts.BinDir, os.Getenv(EnvKubeBinDir))
	if dir == "" {
		if dir, err = buildKubeBinaries(); err != nil {
			return binaries{}, err
		}
	}
	b := binaries{
		etcd:              etcd,
		apiserver:         filepath.Join(dir, "kube-apiserver"),
		controllerManager: filepath.Join(dir, "kube-controller-manager"),
	}
	for _, p := range []string{b.apiserver, b.controllerManager} {
		if _, err := os.Stat(p); err != nil {
			return binaries{}, fmt.Errorf("%w: %w (make tools builds it)", ErrUnavailable, err)
		}
	}
	return b, nil
}

// buildKubeBinaries runs the repo's build script, which builds the pinned
// Kubernetes binaries once into the cache and prints their directory. It
// lets a plain go test work without make; cold, it takes minutes.
func buildKubeBinaries() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("%w: %s not set and %w", ErrUnavailable, EnvKubeBinDir, err)
	}
	fmt.Fprintf(os.Stderr, "testenv: %s not set; running hack/tools.sh kube (a cold build takes minutes)\n", EnvKubeBinDir)
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "tools.sh"), "kube")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: build Kubernetes binaries: %w\n%s", ErrUnavailable, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// moduleRoot finds the Canopy repository root from the working directory,
// which go test sets to the package directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s go.mod above the working directory", modulePath)
		}
		dir = parent
	}
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
