package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/canopy-mesh/canopy/internal/tools"
)

// ErrUnavailable is wrapped by Start's error when a prerequisite is missing
// (etcd, or the Kubernetes binaries), as opposed to a component that failed.
var ErrUnavailable = errors.New("test environment unavailable")

// EnvEtcd names the etcd binary; default: etcd on PATH. The Kubernetes
// binaries are found through internal/tools ($CANOPY_KUBE_BIN_DIR).
const EnvEtcd = "CANOPY_ETCD"

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
	dir := opts.BinDir
	if dir == "" {
		if dir, err = tools.Dir("kube"); err != nil {
			return binaries{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
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

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
