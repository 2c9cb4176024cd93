package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/kubeapply"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/istiod"
	"github.com/canopy-mesh/canopy/internal/tools"
	"github.com/canopy-mesh/canopy/localcluster"
	"github.com/canopy-mesh/canopy/node/configdump"
)

const system = "istio-system"

// mesh is the one cluster of the suite, with Canopy installed.
type mesh struct {
	local *localcluster.Cluster
	c     *cluster.Cluster
	root  string // the module root, for deploy/examples
	// values are the chart values files every install and upgrade uses.
	values []string
	// backend is the CNI agent's redirection backend.
	backend string
}

// TestMesh runs the scenario in order on one cluster of real nodes
// (kubelets, containerd, images pulled from the cluster's registry) per
// redirection backend (CANOPY_E2E_BACKENDS, comma-separated; default
// nftables, the chart's default, then ebpf): each step builds on the state
// the previous one left, as a user's session would. The chart's default
// backend runs every step; the others run the steps whose outcome the
// backend decides (enrollment, redirection, DNS, the real nodes' failures,
// leaving the mesh), which keeps a cold make test within its budget.
// CANOPY_E2E_FULL=1 runs every step, and the iptables backend too, whose
// agent image carries its own iptables; by default that image is proven
// by hack/images (TestAgentImageRunsIptables) and the backend's rules by
// cni/redirect in real network namespaces.
func TestMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "the local cluster needs root")
	}
	full := os.Getenv("CANOPY_E2E_FULL") == "1"
	backends := []string{"nftables", "ebpf"}
	if full {
		backends = append(backends, "iptables")
	}
	if v := os.Getenv("CANOPY_E2E_BACKENDS"); v != "" {
		backends = strings.Split(v, ",")
	}
	for _, backend := range backends {
		if !t.Run(backend, func(t *testing.T) { testMesh(t, backend, full || backend == defaultBackend) }) {
			return
		}
	}
}

// defaultBackend is the chart's cniAgent.backend.
const defaultBackend = "nftables"

func testMesh(t *testing.T, backend string, full bool) {
	// backend marks the steps every backend runs; the others run on the
	// default backend only, unless full.
	steps := []struct {
		name    string
		run     func(*testing.T, *mesh)
		backend bool
	}{
		{"FreshNodesStartNoPodOutsideTheMesh", testFreshNodes, true},
		{"InstallUnderChartIdentities", testChartIdentities, true},
		{"DemoScenario", testDemoScenario, true},
		{"RedirectedByTheBackend", testBackend, true},
		{"DNSThroughTheNodeProxy", testDNS, true},
		{"IstioctlShowsWhatCanopyctlShows", testIstioctl, false},
		{"ProxylessGRPCThroughIstiosAgent", testProxylessGRPC, false},
		{"ContainerdRestartKeepsPodsInTheMesh", testContainerdRestart, true},
		{"PodDeletedWhileTheAgentIsDownLeavesNothing", testPodDeletedWhileAgentDown, true},
		{"NodeRebootStartsNoPodOutsideTheMesh", testNodeReboot, true},
		{"UpgradeUnderLoad", testUpgradeUnderLoad, false},
		{"StrictPeerAuthenticationRefusesPlaintext", testStrict, false},
		{"AllowPolicyByServiceAccount", testAllowByServiceAccount, false},
		{"UnlabelledNamespaceLeavesTheMesh", testUnlabel, true},
		{"UninstallUnenrollsFirst", testUninstall, true},
		{"DeletingEverythingAtOnceStillUnenrolls", testDeleteAtOnce, false},
	}
	tags := imageTags
	if !full {
		tags = imageTags[:1] // the upgrades are not run
	}
	m := up(t, backend, tags)
	for _, s := range steps {
		if !full && !s.backend {
			continue
		}
		if !t.Run(s.name, func(t *testing.T) { s.run(t, m) }) {
			t.Fatalf("step %s failed; later steps depend on it", s.name)
		}
	}
}

// imageTags are the versions the scenario installs: install, then two
// upgrades.
var imageTags = []string{"e2e", "e2e-v2", "e2e-v3"}

// startupTaint is the CNI agent's startup taint, which the cluster's nodes
// register with.
var startupTaint = corev1.Taint{Key: "cni.canopy.dev/not-ready", Effect: corev1.TaintEffectNoSchedule}

// up builds the binaries, starts a two-node local cluster whose nodes
// register with the CNI agent's startup taint, pushes the images of each
// of tags to its registry, applies the sample app (whose pods wait for the
// nodes), then installs Canopy (tags[0]) with canopyctl's install.
func up(t *testing.T, backend string, tags []string) *mesh {
	t.Helper()
	root, err := tools.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	args := []string{"build", "-o", bin}
	// What the local cluster runs: its own binary and the pods' sandbox;
	// and what its registry serves as images: the sample app and
	// Canopy's components.
	for _, c := range []string{"canopy-local", "canopy-pause", "canopy-echo", "canopy-controller", "canopy-cni-agent", "canopy-cni", "canopy-node"} {
		args = append(args, "./cmd/"+c)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	b := localcluster.Binaries{Self: filepath.Join(bin, "canopy-local"), Echo: filepath.Join(bin, "canopy-echo"),
		Pause: filepath.Join(bin, "canopy-pause")}
	if err := b.FindTools(); err != nil {
		ci.Unavailable(t, "local cluster tools: %v", err)
	}
	if err := b.FindNodeTools(); err != nil {
		ci.Unavailable(t, "real nodes' tools: %v", err)
	}
	// Istio's proxyv2 image, which the injector puts in sidecar pods, is
	// Istio's pilot-agent (no Envoy exists here: the sample's pods use
	// the grpc-agent template, which runs the agent alone).
	istio, err := istiod.FindBinaries("")
	if err != nil {
		ci.Unavailable(t, "Istio's binaries: %v", err)
	}
	// Addresses no other test's cluster uses: packages run in parallel
	// (localcluster's own tests have 10.98/10.246 and 10.97/10.247).
	cfg := localcluster.Config{
		Name:       "e2e-mesh",
		Nodes:      2,
		StateDir:   filepath.Join(os.TempDir(), "canopy-local-e2e-mesh"),
		Underlay:   netip.MustParsePrefix("10.95.0.0/24"),
		PodCIDR:    netip.MustParsePrefix("10.248.0.0/16"),
		Runtime:    localcluster.RuntimeContainerd,
		Binaries:   b,
		NodeTaints: []corev1.Taint{startupTaint},
		Log:        slog.New(slog.DiscardHandler),
	}
	_ = localcluster.Down(context.Background(), cfg.StateDir) // a crashed run's leftovers
	local, err := localcluster.Up(t.Context(), cfg)
	if err != nil {
		t.Fatalf("local cluster: %v", err)
	}
	t.Cleanup(func() {
		// The cluster goes in any case (its processes outlive the test);
		// a failure keeps its logs and state files.
		if t.Failed() {
			if dir, err := keepLogs(local.State.Dir); err != nil {
				t.Logf("keep the cluster's logs: %v", err)
			} else {
				t.Logf("cluster logs and state files kept in %s", dir)
			}
		}
		if err := localcluster.Down(context.Background(), local.State.Dir); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	// The images every install and upgrade of the scenario names, pushed
	// as make images pushes them.
	for _, tag := range tags {
		push := exec.Command("go", "run", "./hack/images", "--bin-dir", bin, "--out", t.TempDir(), "--tag", tag,
			"--push", local.State.Registry, "--pilot-agent", istio.PilotAgent)
		push.Dir = root
		if out, err := push.CombinedOutput(); err != nil {
			t.Fatalf("push the images tagged %s: %v\n%s", tag, err, out)
		}
	}
	c, err := cluster.Connect(t.Context(), local.State.Kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	// Canopy's images come from the cluster's registry, as a user's from
	// theirs; the sample app and Istio's agent keep the names users give
	// them (the nodes mirror every registry to the cluster's).
	hub := filepath.Join(t.TempDir(), "hub-values.yaml")
	if err := os.WriteFile(hub, []byte("image:\n  hub: "+local.State.Registry+"/canopy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &mesh{local: local, c: c, root: root, backend: backend,
		values: []string{filepath.Join(root, "deploy/examples/local-values.yaml"), hub}}
	if backend != defaultBackend {
		f := filepath.Join(t.TempDir(), "backend-values.yaml")
		if err := os.WriteFile(f, []byte("cniAgent:\n  backend: "+backend+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		m.values = append(m.values, f)
	}

	// The app comes first, as on fresh nodes joining a cluster that runs
	// it: its pods must wait for the nodes to be ready for the mesh.
	m.apply(t, "deploy/examples/echo.yaml")
	for _, ns := range []string{"demo", "legacy"} {
		poll(t, 60*time.Second, "pods of "+ns+" held back by the startup taint", func(ctx context.Context) (bool, error) {
			pods, err := m.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(pods.Items) == 0 {
				return false, nil
			}
			for _, p := range pods.Items {
				if p.Spec.NodeName != "" {
					return false, fmt.Errorf("pod %s/%s was scheduled to %s before Canopy was installed", ns, p.Name, p.Spec.NodeName)
				}
				if !hasConditionReason(&p, corev1.PodScheduled, corev1.PodReasonUnschedulable) {
					return false, nil
				}
			}
			return true, nil
		})
	}

	var progress strings.Builder
	err = ctl.Install(t.Context(), c, ctl.InstallOptions{
		Namespace:   system,
		Version:     tags[0],
		ValuesFiles: m.values,
		Wait:        3 * time.Minute,
	}, &progress)
	t.Logf("canopyctl install:\n%s", progress.String())
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	for _, d := range []struct{ ns, name string }{{"demo", "echo"}, {"demo", "client"}, {"legacy", "legacy"}} {
		m.waitDeployment(t, d.ns, d.name)
	}
	return m
}

// testFreshNodes: the nodes registered with the startup taint, which held
// the app's pods back until each node's agent was ready; every agent has
// removed it, and every pod of the app started through canopy-cni (the
// agent recorded each pod's CNI ADD; a pod started before the plugin was
// in the node's chain has no record, and would have run outside the mesh
// until the agent found it).
func testFreshNodes(t *testing.T, m *mesh) {
	nodes, err := m.c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, taint := range n.Spec.Taints {
			if taint.Key == startupTaint.Key {
				t.Errorf("node %s still has the startup taint", n.Name)
			}
		}
	}
	m.waitEnrolled(t, "demo", "app")
	for _, ns := range []string{"demo", "legacy"} {
		for _, p := range m.pods(t, ns, "app") {
			record, err := m.local.NodePath(p.Spec.NodeName, "/var/run/canopy/pods/"+string(p.UID)+".json")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(record); err != nil {
				t.Errorf("pod %s/%s did not start through canopy-cni: %v", ns, p.Name, err)
			}
		}
	}
}

// testChartIdentities: the components run as the chart's service
// accounts, with no credential but their own tokens, and those accounts
// cannot do what the chart did not grant.
func testChartIdentities(t *testing.T, m *mesh) {
	want := map[string]string{cluster.ControllerApp: "canopy-controller", cluster.CNIAgentApp: "canopy-cni-agent", cluster.NodeProxyApp: "canopy-node"}
	for app, sa := range want {
		pods, err := m.c.Pods(t.Context(), system, app)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.Spec.ServiceAccountName != sa {
				t.Errorf("%s runs as %q, want the chart's %q", p.Name, p.Spec.ServiceAccountName, sa)
			}
			for _, c := range p.Spec.Containers {
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--kubeconfig") {
						t.Errorf("%s is given a kubeconfig (%s): it must use its service account", p.Name, a)
					}
				}
			}
		}
	}
	// Least privilege, checked by the API server's authorizer.
	for _, tt := range []struct {
		sa, verb, resource, ns string
		allowed                bool
	}{
		{"canopy-controller", "list", "pods", "", true},
		{"canopy-controller", "list", "secrets", "", false},
		{"canopy-controller", "delete", "pods", "demo", false},
		{"canopy-cni-agent", "patch", "pods/status", "demo", true},
		{"canopy-cni-agent", "create", "pods", "demo", false},
		{"canopy-cni-agent", "get", "secrets", system, false},
		{"canopy-node", "list", "pods", "", false},
		{"canopy-node", "get", "configmaps", system, false},
	} {
		if got := m.can(t, tt.sa, tt.verb, tt.resource, tt.ns); got != tt.allowed {
			t.Errorf("%s may %s %s in %q: %v, want %v", tt.sa, tt.verb, tt.resource, tt.ns, got, tt.allowed)
		}
	}
}

// testDemoScenario: what make demo shows, asserted. The sample app's pods
// are in the mesh (HBONE), the legacy one is not (TCP); the client calls
// the echo Service over mutual TLS as spiffe://.../sa/client to
// spiffe://.../sa/echo, and both node proxies report it so.
func testDemoScenario(t *testing.T, m *mesh) {
	var out strings.Builder
	if err := ctl.Workloads(t.Context(), m.c, ctl.WorkloadsOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system}}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	t.Logf("canopyctl workloads:\n%s", out.String())
	rows := m.workloads(t)
	for _, p := range m.pods(t, "demo", "") {
		if got := rows[p.Name]; got.Protocol != "HBONE" || got.Node != p.Spec.NodeName || !contains(got.WorkloadIPs, p.Status.PodIP) {
			t.Errorf("workload %s = %+v, want HBONE on %s at %s", p.Name, got, p.Spec.NodeName, p.Status.PodIP)
		}
	}
	for _, p := range m.pods(t, "legacy", "") {
		if got := rows[p.Name]; got.Protocol != "TCP" {
			t.Errorf("legacy workload %s has protocol %q, want TCP", p.Name, got.Protocol)
		}
	}

	client := m.pods(t, "demo", "app=client")[0]
	for range 3 {
		if body, err := m.fetch(t, &client, "http://echo.demo/"); err != nil || !strings.Contains(body, `"name":"echo-`) {
			t.Fatalf("client -> echo.demo: %v %s", err, body)
		}
	}
	var conns []view.Connection
	poll(t, 30*time.Second, "mTLS connections in the node proxies' metrics", func(ctx context.Context) (bool, error) {
		var out strings.Builder
		if err := ctl.Traffic(ctx, m.c, ctl.TrafficOptions{Namespace: system, Output: "json"}, &out, io.Discard); err != nil {
			return false, nil
		}
		if err := json.Unmarshal([]byte(out.String()), &conns); err != nil {
			return false, err
		}
		return hasConn(conns, "destination", "demo/client", "demo/echo", "mutual_tls") && hasConn(conns, "source", "demo/client", "demo/echo", "mutual_tls"), nil
	})
	for _, c := range conns {
		if c.Source == "demo/client" && c.Destination == "demo/echo" {
			if c.SourcePrincipal != "spiffe://cluster.local/ns/demo/sa/client" || c.DestinationPrincipal != "spiffe://cluster.local/ns/demo/sa/echo" {
				t.Errorf("client -> echo carried as %s -> %s", c.SourcePrincipal, c.DestinationPrincipal)
			}
		}
	}

	// Every node proxy holds certificates, valid now, for the identities
	// of its pods.
	var certs strings.Builder
	if err := ctl.Certificates(t.Context(), m.c, ctl.CertificatesOptions{Namespace: system, Output: "json"}, &certs, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(certs.String(), "spiffe://cluster.local/ns/demo/sa/echo") {
		t.Errorf("no certificate for the echo identity:\n%s", certs.String())
	}
	// The debug views (the whole mesh's configuration) are not on the
	// network: only a port-forward reaches them.
	ctrl := m.pods(t, system, cluster.Selector(cluster.ControllerApp))[0]
	legacy := m.pods(t, "legacy", "app=legacy")[0]
	if err := m.dial(t, &legacy, ctrl.Status.PodIP+":15015"); err == nil {
		t.Error("the controller's debug port answers on the pod network")
	}
	var version strings.Builder
	if err := ctl.Version(t.Context(), m.c, ctl.VersionOptions{Namespace: system, Client: "test"}, &version); err != nil {
		t.Fatal(err)
	}
	// The binaries are built without version ldflags: "dev", asked of
	// them, not the chart label's "e2e".
	for _, want := range []string{"canopy-controller version: dev (1 pods)", "canopy-cni-agent version: dev (2 pods)", "canopy-node version: dev (2 pods)"} {
		if !strings.Contains(version.String(), want) {
			t.Errorf("canopyctl version lacks %q:\n%s", want, version.String())
		}
	}
	var status strings.Builder
	if err := ctl.ProxyStatus(t.Context(), m.c, ctl.ProxyStatusOptions{Namespace: system, Verbose: true}, &status); err != nil {
		t.Fatal(err)
	}
	t.Logf("canopyctl proxy-status --verbose:\n%s", status.String())
	if n := strings.Count(status.String(), "SYNCED"); n < 4 {
		t.Errorf("proxy-status shows %d SYNCED types, want both types of both node proxies:\n%s", n, status.String())
	}
}

// testStrict: with STRICT PeerAuthentication in its namespace, a meshed
// pod refuses plaintext from outside the mesh and still takes mTLS.
func testStrict(t *testing.T, m *mesh) {
	legacy := m.pods(t, "legacy", "app=legacy")[0]
	target := m.pods(t, "demo", "app=echo")[0].Status.PodIP + ":9000"
	if err := m.dial(t, &legacy, target); err != nil {
		t.Fatalf("plaintext from outside the mesh before STRICT: %v", err)
	}
	m.applyYAML(t, `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: demo}
spec: {mtls: {mode: STRICT}}`)
	poll(t, 30*time.Second, "plaintext refused under STRICT", func(context.Context) (bool, error) {
		return m.dial(t, &legacy, target) != nil, nil
	})
	client := m.pods(t, "demo", "app=client")[0]
	if err := m.dial(t, &client, target); err != nil {
		t.Errorf("mTLS from the mesh under STRICT: %v", err)
	}
	m.deleteYAML(t, "security.istio.io/v1", "PeerAuthentication", "demo", "strict")
	poll(t, 30*time.Second, "plaintext accepted again", func(context.Context) (bool, error) {
		return m.dial(t, &legacy, target) == nil, nil
	})
}

// testAllowByServiceAccount: an ALLOW policy on echo admits the client's
// service account and no other, also from inside the mesh.
func testAllowByServiceAccount(t *testing.T, m *mesh) {
	m.applyYAML(t, `
apiVersion: v1
kind: ServiceAccount
metadata: {name: intruder, namespace: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: intruder, namespace: demo}
spec:
  selector: {matchLabels: {app: intruder}}
  template:
    metadata: {labels: {app: intruder}}
    spec:
      serviceAccountName: intruder
      terminationGracePeriodSeconds: 2
      containers:
      - name: intruder
        image: canopy/echo:latest
        command: [canopy-echo]
        args: [serve, --name, intruder]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}`)
	m.waitDeployment(t, "demo", "intruder")
	client := m.pods(t, "demo", "app=client")[0]
	intruder := m.pods(t, "demo", "app=intruder")[0]
	if err := m.dial(t, &intruder, "echo.demo:9000"); err != nil {
		t.Fatalf("intruder -> echo before any policy: %v", err)
	}
	m.applyYAML(t, `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: echo-callers, namespace: demo}
spec:
  selector: {matchLabels: {app: echo}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/demo/sa/client]}}]`)
	poll(t, 30*time.Second, "the intruder refused", func(context.Context) (bool, error) {
		return m.dial(t, &intruder, "echo.demo:9000") != nil, nil
	})
	for range 3 {
		if err := m.dial(t, &client, "echo.demo:9000"); err != nil {
			t.Errorf("client -> echo under the ALLOW policy: %v", err)
		}
	}
	var out strings.Builder
	if err := ctl.Policies(t.Context(), m.c, ctl.ListOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system}, Filter: "demo"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "echo-callers") || !strings.Contains(out.String(), "Allow") {
		t.Errorf("canopyctl policies does not show the policy:\n%s", out.String())
	}
	m.deleteYAML(t, "security.istio.io/v1", "AuthorizationPolicy", "demo", "echo-callers")
}

// testUnlabel: removing the namespace's label takes its pods out cleanly:
// no redirection annotation or enrollment condition left, the tables say
// TCP, and traffic still flows (now in plaintext).
func testUnlabel(t *testing.T, m *mesh) {
	ns, err := m.c.Client.CoreV1().Namespaces().Get(t.Context(), "demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(ns.Labels, "istio.io/dataplane-mode")
	if _, err := m.c.Client.CoreV1().Namespaces().Update(t.Context(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, "every demo pod out of the mesh", func(ctx context.Context) (bool, error) {
		pods, err := m.readyPods(ctx, "demo", "")
		if err != nil {
			return false, nil // retried; the timeout reports
		}
		rows, err := m.workloadRows(ctx)
		if err != nil {
			return false, nil
		}
		for _, p := range pods {
			if p.Annotations["ambient.istio.io/redirection"] != "" || hasCondition(&p, "mesh.canopy.dev/Enrolled") || rows[p.Name].Protocol != "TCP" {
				return false, nil
			}
		}
		return true, nil
	})
	client := m.pods(t, "demo", "app=client")[0]
	if err := m.dial(t, &client, "echo.demo:9000"); err != nil {
		t.Errorf("client -> echo after leaving the mesh: %v", err)
	}
	legacy := m.pods(t, "legacy", "app=legacy")[0]
	if err := m.dial(t, &legacy, "echo.demo:9000"); err != nil {
		t.Errorf("legacy -> echo after the namespace left the mesh: %v", err)
	}
	// Back in, for the uninstall step.
	ns, err = m.c.Client.CoreV1().Namespaces().Get(t.Context(), "demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["istio.io/dataplane-mode"] = "ambient"
	if _, err := m.c.Client.CoreV1().Namespaces().Update(t.Context(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.waitEnrolled(t, "demo", "")
}

// testUninstall: canopyctl uninstall takes pods out of the mesh before it
// removes the components, so the apps keep talking.
func testUninstall(t *testing.T, m *mesh) {
	var out strings.Builder
	err := ctl.Uninstall(t.Context(), m.c, ctl.UninstallOptions{Namespace: system, Wait: 2 * time.Minute, Purge: true}, &out)
	t.Logf("canopyctl uninstall:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.pods(t, "demo", "") {
		if v := p.Annotations["ambient.istio.io/redirection"]; v != "" {
			t.Errorf("%s still annotated %q after uninstall", p.Name, v)
		}
	}
	poll(t, 60*time.Second, "Canopy's pods gone", func(ctx context.Context) (bool, error) {
		pods, err := m.c.Client.CoreV1().Pods(system).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=canopy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	client := m.pods(t, "demo", "app=client")[0]
	if err := m.dial(t, &client, "echo.demo:9000"); err != nil {
		t.Errorf("client -> echo after uninstall: %v", err)
	}
	cms, err := m.c.Client.CoreV1().ConfigMaps("").List(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=istio-ca-root-cert"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cms.Items) != 0 {
		t.Errorf("%d root-certificate ConfigMaps left after uninstall --purge", len(cms.Items))
	}
	m.checkPluginGone(t, 4)
	for _, p := range m.pods(t, "demo", "") {
		if v := p.Annotations["ambient.istio.io/redirection"]; v != "" {
			t.Errorf("%s still annotated %q after the uninstall", p.Name, v)
		}
	}
}

// testDeleteAtOnce: an uninstaller that deletes every object of the chart
// at once, without waiting (helm uninstall, a deleted namespace), deletes
// the agents' RBAC while they stop. Their watch on their DaemonSet, opened
// while they were allowed to, still tells them it went, and they take
// their nodes out of the mesh anyway:
// the rules leave the pods and the plugin leaves the chain. (The pods'
// annotations stay: nothing may write them any more.)
func testDeleteAtOnce(t *testing.T, m *mesh) {
	var progress strings.Builder
	err := ctl.Install(t.Context(), m.c, ctl.InstallOptions{
		Namespace: system, Version: "e2e", SkipCRDs: true, Wait: 3 * time.Minute,
		ValuesFiles: m.values,
	}, &progress)
	if err != nil {
		t.Fatalf("reinstall: %v\n%s", err, progress.String())
	}
	m.waitEnrolled(t, "demo", "app=echo")
	r, err := ctl.RenderChart(ctl.InstallOptions{Namespace: system})
	if err != nil {
		t.Fatal(err)
	}
	a, err := kubeapply.New(m.c.Config, kubeapply.Options{FieldManager: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	// The harshest order: the agents' identity and RBAC go before their
	// DaemonSet, as a namespace deletion may do it.
	var daemonSets, rest []*unstructured.Unstructured
	for _, o := range r.Objects {
		if o.GetKind() == "DaemonSet" {
			daemonSets = append(daemonSets, o)
		} else {
			rest = append(rest, o)
		}
	}
	if err := a.Delete(t.Context(), rest); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the agent's access revoked", func(context.Context) (bool, error) {
		return !m.can(t, "canopy-cni-agent", "get", "daemonsets", system), nil
	})
	if err := a.Delete(t.Context(), daemonSets); err != nil {
		t.Fatal(err)
	}
	poll(t, 90*time.Second, "Canopy's pods gone", func(ctx context.Context) (bool, error) {
		pods, err := m.c.Client.CoreV1().Pods(system).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=canopy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	m.checkPluginGone(t, 5)
	client := m.pods(t, "demo", "app=client")[0]
	legacy := m.pods(t, "legacy", "app=legacy")[0]
	for _, from := range []*corev1.Pod{&client, &legacy} {
		if err := m.dial(t, from, "echo.demo:9000"); err != nil {
			t.Errorf("%s -> echo after everything was deleted: %v", from.Name, err)
		}
	}
}

// checkPluginGone: the plugin is out of every node's chain (it fails
// closed: left behind, no pod could start), and new pods start: echo
// scaled to replicas comes up.
func (m *mesh) checkPluginGone(t *testing.T, replicas int32) {
	t.Helper()
	var confs []string
	for _, n := range m.local.State.Nodes {
		dir, err := m.local.NodePath(n.Name, "/etc/cni/net.d")
		if err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no CNI configuration found on %s: %v", n.Name, err)
		}
		confs = append(confs, files...)
	}
	for _, f := range confs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "canopy-cni") {
			t.Errorf("%s still chains canopy-cni after the uninstall:\n%s", f, b)
		}
	}
	d, err := m.c.Client.AppsV1().Deployments("demo").Get(t.Context(), "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = ptr(replicas)
	if _, err := m.c.Client.AppsV1().Deployments("demo").Update(t.Context(), d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.waitDeployment(t, "demo", "echo")
}

func ptr[T any](v T) *T { return &v }

// dial has pod open a new TCP connection to addr (canopy-echo's /dial,
// reached by port-forward) and checks the echo: a new connection each
// time, so each is authorized afresh.
func (m *mesh) dial(t *testing.T, from *corev1.Pod, addr string) error {
	t.Helper()
	body, err := m.c.Get(t.Context(), from, 8080, "/dial?msg=canopy&addr="+url.QueryEscape(addr))
	if err != nil {
		return err
	}
	if string(body) != "canopy" {
		return fmt.Errorf("echo of %q: %q", "canopy", body)
	}
	return nil
}

// fetch has pod GET u (canopy-echo's /fetch), reached by port-forward.
func (m *mesh) fetch(t *testing.T, from *corev1.Pod, u string) (string, error) {
	t.Helper()
	body, err := m.c.Get(t.Context(), from, 8080, "/fetch?url="+url.QueryEscape(u))
	return string(body), err
}

func (m *mesh) workloads(t *testing.T) map[string]workloadRow {
	t.Helper()
	rows, err := m.workloadRows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func (m *mesh) workloadRows(ctx context.Context) (map[string]workloadRow, error) {
	var out strings.Builder
	if err := ctl.Workloads(ctx, m.c, ctl.WorkloadsOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system}, Output: "json"}, &out, io.Discard); err != nil {
		return nil, err
	}
	var ws []configdump.Workload
	if err := json.Unmarshal([]byte(out.String()), &ws); err != nil {
		return nil, fmt.Errorf("decode workloads: %w", err)
	}
	rows := map[string]workloadRow{}
	for _, w := range ws {
		rows[w.Name] = w
	}
	return rows, nil
}

func (m *mesh) pods(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	pods, err := m.readyPods(t.Context(), ns, selector)
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

// readyPods are the ready, not terminating pods of ns matching selector;
// none is an error.
func (m *mesh) readyPods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	list, err := m.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && cluster.Ready(&p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no ready pod in %s matching %q", ns, selector)
	}
	return out, nil
}

// waitEnrolled waits until every ready pod of ns matching selector is in
// the mesh, as its redirection annotation says.
func (m *mesh) waitEnrolled(t *testing.T, ns, selector string) {
	t.Helper()
	poll(t, 60*time.Second, "pods of "+ns+" in the mesh", func(ctx context.Context) (bool, error) {
		pods, err := m.readyPods(ctx, ns, selector)
		if err != nil {
			return false, nil // retried; the timeout reports
		}
		for _, p := range pods {
			if p.Annotations["ambient.istio.io/redirection"] != "enabled" {
				return false, nil
			}
		}
		return true, nil
	})
}

func (m *mesh) waitDeployment(t *testing.T, ns, name string) {
	t.Helper()
	poll(t, 2*time.Minute, "deployment "+ns+"/"+name, func(ctx context.Context) (bool, error) {
		d, err := m.c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		return d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas == want && d.Status.UpdatedReplicas == want && d.Status.Replicas == want, nil
	})
}

func (m *mesh) apply(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.root, file))
	if err != nil {
		t.Fatal(err)
	}
	m.applyYAML(t, string(b))
}

func (m *mesh) applyYAML(t *testing.T, doc string) {
	t.Helper()
	objs, err := chart.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	a, err := kubeapply.New(m.c.Config, kubeapply.Options{FieldManager: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(t.Context(), objs); err != nil {
		t.Fatal(err)
	}
}

func (m *mesh) deleteYAML(t *testing.T, apiVersion, kind, ns, name string) {
	t.Helper()
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(apiVersion)
	o.SetKind(kind)
	o.SetNamespace(ns)
	o.SetName(name)
	a, err := kubeapply.New(m.c.Config, kubeapply.Options{FieldManager: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(t.Context(), []*unstructured.Unstructured{o}); err != nil {
		t.Fatal(err)
	}
}

// can asks the API server whether a Canopy service account may do verb on
// resource: a self review as that account, through impersonation.
func (m *mesh) can(t *testing.T, sa, verb, resource, ns string) bool {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", m.local.State.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + system + ":" + sa
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + system, "system:authenticated"}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, sub, _ := strings.Cut(resource, "/")
	review, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(t.Context(), selfReview(verb, res, sub, ns), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.Allowed
}

func poll(t *testing.T, timeout time.Duration, what string, f func(context.Context) (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, timeout, true, f)
	if err != nil {
		t.Fatalf("wait for %s: %v", what, err)
	}
}

func hasConn(cs []view.Connection, reporter, src, dst, security string) bool {
	for _, c := range cs {
		if c.Reporter == reporter && c.Source == src && c.Destination == dst && c.Security == security && c.Opened > 0 {
			return true
		}
	}
	return false
}

func hasConditionReason(p *corev1.Pod, typ corev1.PodConditionType, reason string) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ && c.Reason == reason {
			return true
		}
	}
	return false
}

func hasCondition(p *corev1.Pod, typ string) bool {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == typ {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

type workloadRow = configdump.Workload

func selfReview(verb, resource, subresource, ns string) *authorizationv1.SelfSubjectAccessReview {
	return &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource, Subresource: subresource, Namespace: ns, Group: ""},
	}}
}

// keepLogs copies the cluster's logs and small state files (not etcd's
// data, keys or sockets) to a new temporary directory.
func keepLogs(stateDir string) (string, error) {
	dst, err := os.MkdirTemp("", "canopy-e2e-logs-")
	if err != nil {
		return "", err
	}
	err = filepath.WalkDir(stateDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file that went away meanwhile
		}
		if d.IsDir() && d.Name() == "etcd" {
			return filepath.SkipDir
		}
		// Nor private keys and tokens: only what explains a failure.
		if !d.Type().IsRegular() || strings.HasSuffix(d.Name(), ".key") || d.Name() == "tokens.csv" {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 16<<20 {
			return nil
		}
		rel, _ := filepath.Rel(stateDir, path)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	return dst, err
}
