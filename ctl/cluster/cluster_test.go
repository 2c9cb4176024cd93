package cluster_test

import (
	"os"
	"strings"
	"testing"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestErrorsSayWhatToDo: the first thing a user without Canopy meets.
func TestErrorsSayWhatToDo(t *testing.T) {
	testenv.Need(t, env)
	c, err := cluster.Connect(env.KubeconfigPath, "")
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "ctl", nil)
	_, err = c.ReadyPod(t.Context(), ns, cluster.ControllerApp)
	if err == nil || !strings.Contains(err.Error(), "no canopy-controller found in namespace "+ns+": run canopyctl install") {
		t.Errorf("no controller: %v", err)
	}
	if _, err := cluster.Connect(env.KubeconfigPath, "no-such-context"); err == nil || !strings.Contains(err.Error(), "no-such-context") {
		t.Errorf("unknown context: %v", err)
	}
}
