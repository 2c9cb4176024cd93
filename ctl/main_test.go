package ctl

import (
	"os"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// env is the package's API server, for the kube-level tests of install,
// upgrade and uninstall; nil when it could not start (they skip).
var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }
