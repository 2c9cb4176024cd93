package e2e_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/internal/echo"
)

// testUpgradeUnderLoad: while every pod of the demo namespace (the client,
// and the echo pods on both nodes) opens a new connection to echo.demo's
// TCP port every 20 ms and holds two long-lived ones, canopyctl install
// upgrades the release to a new image tag: every component rolls (node
// proxies with a surge, handing over to the new one, CNI agents, the
// controller). No new connection may fail. Long-lived connections may be
// cut only when a draining node proxy's drain period ends (the documented
// bound), never refused or reset earlier; the step reports the counts and
// the longest stall.
//
// It runs only with CANOPY_E2E_UPGRADE=1: it adds two and a half minutes,
// and it does not pass yet (docs/testing.md, "Upgrade under load").
func testUpgradeUnderLoad(t *testing.T, m *mesh) {
	if os.Getenv("CANOPY_E2E_UPGRADE") != "1" {
		t.Skip("the upgrade under load runs with CANOPY_E2E_UPGRADE=1")
	}
	pods := m.pods(t, "demo", "")
	addr := url.QueryEscape("echo.demo.svc.cluster.local:9000")
	const run = 150 * time.Second
	for i := range pods {
		if _, err := m.c.Get(t.Context(), &pods[i], 8080, "/load/start?held=2&duration="+run.String()+"&addr="+addr); err != nil {
			t.Fatalf("start load in %s: %v", pods[i].Name, err)
		}
	}
	started := time.Now()
	time.Sleep(5 * time.Second)

	var progress strings.Builder
	err := ctl.Install(t.Context(), m.c, ctl.InstallOptions{
		Namespace:   system,
		Version:     "e2e-upgraded",
		ValuesFiles: []string{m.root + "/deploy/examples/local-values.yaml"},
		Wait:        3 * time.Minute,
	}, &progress)
	t.Logf("canopyctl install (upgrade) after %s:\n%s", time.Since(started).Round(time.Second), progress.String())
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	upgraded := time.Since(started)

	for i := range pods {
		rep := loadReport(t, m, &pods[i], run+time.Minute)
		t.Logf("%s on %s: %d new connections, %d failed %v (by second of the run: %v), longest stall %s; %d held, %d cut, %d echoes; errors %q (run began %s, upgrade done %s into it)",
			pods[i].Name, pods[i].Spec.NodeName, rep.Connections, rep.Failures, rep.ByKind, rep.FailuresAt, rep.LongestStall,
			rep.Held, rep.HeldFailures, rep.HeldEchoes, rep.Errors, rep.Start.Format("15:04:05.000"), upgraded.Round(time.Second))
		if rep.Failures != 0 {
			t.Errorf("%s: %d of %d new connections failed during the upgrade: %v %q", pods[i].Name, rep.Failures, rep.Connections, rep.ByKind, rep.Errors)
		}
		if rep.Connections < 1000 {
			t.Errorf("%s: only %d connections in %s", pods[i].Name, rep.Connections, run)
		}
	}
}

// loadReport waits for a pod's load run to end and returns its report.
func loadReport(t *testing.T, m *mesh, pod *corev1.Pod, within time.Duration) echo.LoadReport {
	t.Helper()
	var rep echo.LoadReport
	poll(t, within, "the load report of "+pod.Name, func(ctx context.Context) (bool, error) {
		body, err := m.c.Get(ctx, pod, 8080, "/load/result")
		if err != nil {
			return false, nil
		}
		return true, json.Unmarshal(body, &rep)
	})
	return rep
}
