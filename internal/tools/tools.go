// Package tools finds the third-party binaries Canopy's tests and local
// cluster run (Kubernetes, CoreDNS, CNI plugins, Istio's istiod and
// istioctl), which hack/tools.sh builds from the modules pinned under tools/
// into a cache outside the repo.
package tools

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrNotFound is wrapped when a tool directory can be neither found nor
// built.
var ErrNotFound = errors.New("tool binaries not found")

const modulePath = "github.com/canopy-mesh/canopy"

// EnvVar is the variable that points at a tool module's binaries, e.g.
// CANOPY_KUBE_BIN_DIR for "kube"; make sets them.
func EnvVar(module string) string {
	return "CANOPY_" + strings.ToUpper(module) + "_BIN_DIR"
}

// Dir returns the directory of a tool module's binaries ("kube", "coredns",
// "cni", "buf", "istio"): $CANOPY_<MODULE>_BIN_DIR, else what hack/tools.sh builds (once;
// a cold build takes minutes) when run inside the Canopy repository.
func Dir(module string) (string, error) {
	if d := os.Getenv(EnvVar(module)); d != "" {
		return d, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("%w: %s not set and %w", ErrNotFound, EnvVar(module), err)
	}
	fmt.Fprintf(os.Stderr, "%s not set; running hack/tools.sh %s (a cold build takes minutes)\n", EnvVar(module), module)
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "tools.sh"), module)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: hack/tools.sh %s: %w\n%s", ErrNotFound, module, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// ModuleRoot finds the Canopy repository root from the working directory
// (go test sets it to the package directory).
func ModuleRoot() (string, error) {
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
