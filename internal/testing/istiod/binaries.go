package istiod

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/canopy-mesh/canopy/internal/tools"
)

// ErrUnavailable is wrapped when the Istio binaries can be neither found
// nor built: a missing prerequisite, not a failure of istiod.
var ErrUnavailable = errors.New("istio binaries unavailable")

// Binaries are the absolute paths of Istio's programs.
type Binaries struct {
	// PilotDiscovery is istiod's binary.
	PilotDiscovery string
	// Istioctl is Istio's command-line tool.
	Istioctl string
	// PilotAgent is the agent of Istio's proxyv2 image.
	PilotAgent string
}

// FindBinaries returns the Istio binaries of dir, else of
// $CANOPY_ISTIO_BIN_DIR, else of what hack/tools.sh istio builds (once; a
// cold build takes several minutes) when run inside the Canopy repository.
func FindBinaries(dir string) (Binaries, error) {
	if dir == "" {
		var err error
		if dir, err = tools.Dir("istio"); err != nil {
			return Binaries{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	b := Binaries{PilotDiscovery: filepath.Join(dir, "pilot-discovery"), Istioctl: filepath.Join(dir, "istioctl"), PilotAgent: filepath.Join(dir, "pilot-agent")}
	for _, p := range []string{b.PilotDiscovery, b.Istioctl, b.PilotAgent} {
		if _, err := os.Stat(p); err != nil {
			return Binaries{}, fmt.Errorf("%w: %w (hack/tools.sh istio builds it)", ErrUnavailable, err)
		}
	}
	return b, nil
}
