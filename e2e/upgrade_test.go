package e2e_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/internal/echo"
)

// testUpgradeUnderLoad: while every pod of the demo namespace (the client,
// and the echo pods on both nodes) opens a new connection to echo.demo's
// TCP port every 20 ms and holds two long-lived ones, the release is
// upgraded twice: canopyctl upgrade one component at a time (controller,
// CNI agents, node proxies, each rolled out before the next) to a new
// image tag, then all at once to another. Every component rolls each time
// (node proxies with a surge, handing over to the new one). No new
// connection may fail. Long-lived connections may be cut only when a
// draining node proxy's drain period ends (the documented bound); the
// step reports the counts, when failures happened and the longest stall.
//
// CANOPY_E2E_UPGRADE=0 skips it (it takes about two minutes).
func testUpgradeUnderLoad(t *testing.T, m *mesh) {
	if os.Getenv("CANOPY_E2E_UPGRADE") == "0" {
		t.Skip("CANOPY_E2E_UPGRADE=0")
	}
	pods := m.pods(t, "demo", "")
	addr := url.QueryEscape("echo.demo.svc.cluster.local:9000")
	// The runs are stopped once the upgrades are done and the last drain
	// is over; the duration only bounds a run nobody stops.
	for i := range pods {
		if _, err := m.c.Get(t.Context(), &pods[i], 8080, "/load/start?held=2&duration=10m&addr="+addr); err != nil {
			t.Fatalf("start load in %s: %v", pods[i].Name, err)
		}
	}
	stopLoad := func() {
		for i := range pods {
			if _, err := m.c.Get(context.WithoutCancel(t.Context()), &pods[i], 8080, "/load/stop"); err != nil {
				t.Errorf("stop load in %s: %v", pods[i].Name, err)
			}
		}
	}
	started := time.Now()
	time.Sleep(5 * time.Second)

	values := m.values
	drainPeriod := nodeDrainPeriod(t, ctl.InstallOptions{Namespace: system, ValuesFiles: values})
	// spans are when each upgrade ran, in seconds of the run.
	var spans [][2]int
	for _, phase := range []struct {
		name string
		opts ctl.UpgradeOptions
	}{
		{"one component at a time", ctl.UpgradeOptions{InstallOptions: ctl.InstallOptions{Namespace: system, Version: "e2e-v2", ValuesFiles: values, Wait: 3 * time.Minute}}},
		{"all at once", ctl.UpgradeOptions{InstallOptions: ctl.InstallOptions{Namespace: system, Version: "e2e-v3", ValuesFiles: values, Wait: 3 * time.Minute}, AllAtOnce: true}},
	} {
		from := time.Since(started)
		var progress strings.Builder
		err := ctl.Upgrade(t.Context(), m.c, phase.opts, &progress)
		t.Logf("canopyctl upgrade %s (%s), from %s to %s into the run:\n%s", phase.name, phase.opts.Version,
			from.Round(time.Second), time.Since(started).Round(time.Second), progress.String())
		if err != nil {
			stopLoad()
			t.Fatalf("upgrade %s: %v", phase.name, err)
		}
		spans = append(spans, [2]int{int(from / time.Second), int(time.Since(started) / time.Second)})
		// The old node proxies drain after the rollout: the next phase and
		// the end of the run wait for that, and 5 s more.
		time.Sleep(drainPeriod + 5*time.Second)
	}
	stopLoad()

	for i := range pods {
		rep := loadReport(t, m, &pods[i], time.Minute)
		t.Logf("%s on %s: %d new connections, %d failed %v (by second of the run: %v), longest stall %s; %d held, %d cut (by second: %v), %d echoes; errors %q (run began %s, lasted %s)",
			pods[i].Name, pods[i].Spec.NodeName, rep.Connections, rep.Failures, rep.ByKind, rep.FailuresAt, rep.LongestStall,
			rep.Held, rep.HeldFailures, rep.HeldFailuresAt, rep.HeldEchoes, rep.Errors, rep.Start.Format("15:04:05.000"), time.Since(started).Round(time.Second))
		if rep.Failures != 0 {
			t.Errorf("%s: %d of %d new connections failed during the upgrades: %v %q", pods[i].Name, rep.Failures, rep.Connections, rep.ByKind, rep.Errors)
		}
		// A held connection may be cut only by a draining node proxy at
		// the end of its drain: a drain period after its upgrade began,
		// at most a drain period (and a little) after it was done.
		for sec, n := range rep.HeldFailuresAt {
			if !slices.ContainsFunc(spans, func(s [2]int) bool {
				return sec >= s[0]+int(drainPeriod/time.Second)-1 && sec <= s[1]+int(drainPeriod/time.Second)+5
			}) {
				t.Errorf("%s: %d held connections cut %d s into the run, outside every drain's end (upgrades ran %v s into the run, drain %s)",
					pods[i].Name, n, sec, spans, drainPeriod)
			}
		}
		if rep.Connections < 1000 {
			t.Errorf("%s: only %d connections in %s", pods[i].Name, rep.Connections, time.Since(started).Round(time.Second))
		}
	}
}

// nodeDrainPeriod is the node proxy's --drain-period as the chart renders
// it with opts.
func nodeDrainPeriod(t *testing.T, opts ctl.InstallOptions) time.Duration {
	t.Helper()
	r, err := ctl.RenderChart(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.Objects {
		if o.GetKind() != "DaemonSet" || o.GetName() != "ztunnel" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--drain-period="); ok {
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
		}
	}
	t.Fatal("the chart renders no node proxy with --drain-period")
	return 0
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
