package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/testing/golden"
)

// runMainEnv makes the test binary run canopyctl's main instead of the
// tests: TestBinary re-executes it so that main's real stderr, klog
// included, is what the golden files hold.
const runMainEnv = "CANOPYCTL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// transcript is how golden files show a run: the command line, the exit
// code, stdout and stderr.
func transcript(args []string, code int, stdout, stderr string) []byte {
	return fmt.Appendf(nil, "$ canopyctl %s\nexit code: %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), code, stdout, stderr)
}

// fakeCluster is a Canopy namespace (istio-system) of ready node proxies
// on node-1 and node-2, one not ready on node-3, and a controller; Get
// serves files of testdata.
type fakeCluster struct {
	pods []corev1.Pod
	// files maps "<pod>:<port><path>" to a file of testdata.
	files map[string]string
}

var _ ctl.PodReader = (*fakeCluster)(nil)

func pod(name, app, node string, ready bool) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "istio-system", Labels: map[string]string{cluster.ComponentLabel: app}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{
		pods: []corev1.Pod{
			pod("canopy-node-a", cluster.NodeProxyApp, "node-1", true),
			pod("canopy-node-b", cluster.NodeProxyApp, "node-2", true),
			pod("canopy-node-c", cluster.NodeProxyApp, "node-3", false),
			pod("canopy-controller-0", cluster.ControllerApp, "node-1", true),
			{ObjectMeta: metav1.ObjectMeta{Name: "client-1", Namespace: "demo"}, Spec: corev1.PodSpec{NodeName: "node-2"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "demo"}},
		},
		files: map[string]string{
			"canopy-node-a:15000/config_dump":                   "config-dump-node.json",
			"canopy-node-b:15000/config_dump":                   "config-dump-node.json",
			"canopy-node-a:15020/metrics":                       "metrics-node-1.prom",
			"canopy-node-b:15020/metrics":                       "metrics-node-2.prom",
			"canopy-node-b:15000/debug/dns?pod=demo%2Fclient-1": "dns-client.json",
		},
	}
}

// Pods implements ctl.PodReader.
func (f *fakeCluster) Pods(_ context.Context, namespace, app string) ([]corev1.Pod, error) {
	var out []corev1.Pod
	for _, p := range f.pods {
		if p.Namespace == namespace && p.Labels[cluster.ComponentLabel] == app {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, cluster.NoPods(namespace, app)
	}
	slices.SortStableFunc(out, func(a, b corev1.Pod) int {
		if ra, rb := cluster.Ready(&a), cluster.Ready(&b); ra != rb && ra {
			return -1
		} else if ra != rb {
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// Pod implements ctl.PodReader.
func (f *fakeCluster) Pod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	for i := range f.pods {
		if f.pods[i].Namespace == namespace && f.pods[i].Name == name {
			return &f.pods[i], nil
		}
	}
	return nil, fmt.Errorf("get pod %s/%s: pods %q not found", namespace, name, name)
}

// InjectedPods implements ctl.PodReader.
func (f *fakeCluster) InjectedPods(context.Context) ([]corev1.Pod, error) {
	var out []corev1.Pod
	for _, p := range f.pods {
		if p.Annotations["sidecar.istio.io/status"] != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// Get implements ctl.PodReader.
func (f *fakeCluster) Get(_ context.Context, p *corev1.Pod, port int, path string) ([]byte, error) {
	file, ok := f.files[fmt.Sprintf("%s:%d%s", p.Name, port, path)]
	if !ok {
		return nil, fmt.Errorf("GET %s of %s/%s:%d: 404 Not Found", path, p.Namespace, p.Name, port)
	}
	return os.ReadFile(filepath.Join("testdata", file))
}

// errConnected is what a command gets from the cluster where it should
// have stopped before connecting; golden files would show it.
var errConnected = errors.New("test: the command connected to the cluster")

// TestCommands runs canopyctl in process against a fake cluster (or, for
// kubeconfig errors, the real connection code) and compares each run with
// testdata/<name>.golden.
func TestCommands(t *testing.T) {
	fake := func(context.Context, *globals) (ctl.PodReader, error) { return newFakeCluster(), nil }
	noConnect := func(context.Context, *globals) (ctl.PodReader, error) { return nil, errConnected }
	for _, tt := range []struct {
		name   string
		reader readerFunc
		args   []string
	}{
		// Filters that match nothing: kubectl's message on stderr, exit 0.
		{"workloads-unknown-namespace", fake, []string{"workloads", "-n", "does-not-exist"}},
		{"workloads-unknown-node", fake, []string{"workloads", "--node", "no-such-node"}},
		{"workloads-unknown-namespace-json", fake, []string{"workloads", "-n", "does-not-exist", "-o", "json"}},
		{"workloads-namespace", fake, []string{"workloads", "-n", "demo"}},
		{"services-unknown-namespace", fake, []string{"services", "-n", "does-not-exist"}},
		{"services-namespace-json", fake, []string{"services", "-n", "demo", "-o", "json"}},
		{"policies-unknown-namespace", fake, []string{"policies", "-n", "does-not-exist"}},
		// Each command accepts the formats its help lists.
		{"services-output-wide", noConnect, []string{"services", "-o", "wide"}},
		{"workloads-output-table", noConnect, []string{"workloads", "-o", "table"}},
		// config-dump's target, checked before connecting.
		{"config-dump-no-target", noConnect, []string{"config-dump"}},
		{"config-dump-unknown-target", noConnect, []string{"config-dump", "envoy"}},
		{"config-dump-two-targets", noConnect, []string{"config-dump", "node", "controller"}},
		{"config-dump-node-proxy-id", noConnect, []string{"config-dump", "node", "--proxy-id", "canopy-node-a.istio-system"}},
		{"config-dump-controller-node", noConnect, []string{"config-dump", "controller", "--node", "node-1"}},
		{"config-dump-unknown-node", fake, []string{"config-dump", "node", "--node", "no-such-node"}},
		{"config-dump-unknown-pod", fake, []string{"config-dump", "node", "--pod", "canopy-node-x"}},
		// A pod's DNS, from the node proxy on its node.
		{"dns", fake, []string{"dns", "demo/client-1"}},
		{"dns-json", fake, []string{"dns", "demo/client-1", "-o", "json"}},
		{"dns-not-a-pod", fake, []string{"dns", "client-1"}},
		{"dns-unscheduled", fake, []string{"dns", "demo/pending"}},
		// Denials.
		{"traffic", fake, []string{"traffic"}},
		{"traffic-denied", fake, []string{"traffic", "--denied"}},
		{"traffic-denied-none", fake, []string{"traffic", "--denied", "--node", "node-1"}},
		{"traffic-unknown-node", fake, []string{"traffic", "--node", "no-such-node"}},
		// Errors that name the fix.
		{"workloads-no-canopy", fake, []string{"workloads", "-i", "wrong-namespace"}},
		{"unknown-context", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "--context", "nosuchcontext", "workloads"}},
		// install, upgrade and uninstall check their flags before connecting
		// (testdata/kubeconfig's server listens nowhere).
		{"install-revision-default", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "install", "--revision", "default"}},
		{"install-skip-and-force-crds", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "install", "--skip-crds", "--force-crds"}},
		{"upgrade-no-wait", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "upgrade", "--wait=0"}},
		{"upgrade-bad-revision", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "upgrade", "--revision", "Canary"}},
		{"uninstall-revision-purge", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "uninstall", "--revision", "canary", "--purge"}},
		{"upgrade-dry-run-revision", connectReader, []string{"--kubeconfig", "testdata/kubeconfig", "upgrade", "--dry-run", "--revision", "canary", "--skip-crds", "--version", "1.2.3", "--wait", "2m"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := execute(t.Context(), newRootCommand(tt.reader), tt.args, &stdout, &stderr)
			golden.Check(t, tt.name+".golden", transcript(tt.args, code, stdout.String(), stderr.String()))
		})
	}
}

// TestBinary runs canopyctl as a process (this test binary, re-executed
// into main) against API servers that fail, so that everything on its
// real stderr shows: its own error, naming the fix, and no log line of
// client-go's.
func TestBinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// brokenDiscovery answers /version but fails discovery, which makes
	// client-go's discovery cache log through klog.
	brokenDiscovery := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`)
			return
		}
		http.Error(w, "discovery is down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(brokenDiscovery.Close)
	brokenKubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: x}\n", brokenDiscovery.URL)
	if err := os.WriteFile(brokenKubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name       string
		kubeconfig string
		args       []string
	}{
		{"binary-unreachable-uninstall", "testdata/kubeconfig", []string{"uninstall"}},
		{"binary-unreachable-workloads", "testdata/kubeconfig", []string{"workloads"}},
		{"binary-broken-discovery-uninstall", brokenKubeconfig, []string{"uninstall", "--wait=0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), exe, tt.args...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1", "KUBECONFIG="+tt.kubeconfig, "HOME="+t.TempDir())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			got := transcript(tt.args, cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
			// The test server's address changes from run to run.
			got = bytes.ReplaceAll(got, []byte(brokenDiscovery.URL), []byte("http://SERVER"))
			golden.Check(t, tt.name+".golden", got)
		})
	}
}
