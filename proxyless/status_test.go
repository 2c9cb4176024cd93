package proxyless

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/istiod"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestIstioctlShowsProxylessClientSynced: Istio's own istioctl
// proxy-status, against canopy-controller, lists a proxyless gRPC client
// with its four Envoy types SYNCED once it has called a service.
func TestIstioctlShowsProxylessClientSynced(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	bins, err := istiod.FindBinaries("")
	if errors.Is(err, istiod.ErrUnavailable) {
		ci.Unavailable(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	sys := env.Namespace(t, "canopy-system", nil)
	c := startController(t, sys)
	ns, ips := echoApp(t, 1)
	podAt(t, ns, "echo-v1", ips[0], map[string]string{"app": "echo"})
	conn := xdsClient(t, c, ns, "client", "xds:///echo."+ns+".svc.cluster.local:7070")
	eventually.Within(t, settle, "a call answered", func() bool { return calls(ctx, conn, 1)[ips[0]] == 1 })

	row := ""
	eventually.Within(t, settle, "istioctl proxy-status -v 1 shows CDS, LDS, EDS and RDS SYNCED", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, bins.Istioctl, "proxy-status", "-v", "1", "--kubeconfig", env.KubeconfigPath,
			"--istioNamespace", sys, "--xds-address", c.secure)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("istioctl proxy-status: %v\n%s", err, out)
			return false
		}
		row = ""
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "client."+ns+" ") {
				row = strings.TrimSpace(line)
			}
		}
		return strings.Count(row, "SYNCED") == 4
	})
	t.Logf("istioctl proxy-status -v 1: %s", row)
}
