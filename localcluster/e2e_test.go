package localcluster_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/internal/echo"
	"github.com/canopy-mesh/canopy/internal/procs"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/tools"
	"github.com/canopy-mesh/canopy/localcluster"
)

// These tests run a real local cluster: root, real namespaces, real
// processes and real traffic. One cluster serves the package; the crash
// test makes a second one of its own.

var (
	cluster     *localcluster.Cluster
	binaries    localcluster.Binaries
	unavailable string // why the cluster could not start, if it could not
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // need skips every test
	}
	if os.Geteuid() != 0 {
		unavailable = "the local cluster needs root"
		return m.Run()
	}
	bin, err := os.MkdirTemp("", "canopy-local-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(bin)
	if binaries, err = buildBinaries(bin); err != nil {
		if ci.Enabled() {
			fmt.Fprintln(os.Stderr, "localcluster e2e:", err)
			return 1
		}
		unavailable = err.Error()
		return m.Run()
	}
	ctx := context.Background()
	cfg := testConfig("e2e", 2, "10.98.0.0/24", "10.246.0.0/16")
	start := time.Now()
	if cluster, err = localcluster.Up(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster e2e: up:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "localcluster e2e: cluster up in %.1fs\n", time.Since(start).Seconds())
	code := m.Run()
	if err := localcluster.Down(ctx, cluster.State.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster e2e: down:", err)
		return 1
	}
	return code
}

func testConfig(name string, nodes int, underlay, pods string) localcluster.Config {
	return localcluster.Config{
		Name:     name,
		Nodes:    nodes,
		StateDir: filepath.Join(os.TempDir(), "canopy-local-"+name),
		Underlay: netip.MustParsePrefix(underlay),
		PodCIDR:  netip.MustParsePrefix(pods),
		Binaries: binaries,
		Log:      slog.New(slog.DiscardHandler),
	}
}

// buildBinaries builds canopy-local and canopy-echo once for the package
// and finds the pinned tools.
func buildBinaries(dir string) (localcluster.Binaries, error) {
	b := localcluster.Binaries{Self: filepath.Join(dir, "canopy-local"), Echo: filepath.Join(dir, "canopy-echo")}
	root, err := tools.ModuleRoot()
	if err != nil {
		return b, err
	}
	cmd := exec.Command("go", "build", "-o", dir, "./cmd/canopy-local", "./cmd/canopy-echo")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return b, fmt.Errorf("build binaries: %w\n%s", err, out)
	}
	return b, b.FindTools()
}

func need(t *testing.T) kubernetes.Interface {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped in -short mode")
	}
	if cluster == nil {
		ci.Unavailable(t, "no local cluster: %s", unavailable)
	}
	return cluster.Client
}

func namespace(t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	// Pods need the namespace's default service account.
	poll(t, 30*time.Second, "default service account", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return ns.Name
}

func poll(t *testing.T, timeout time.Duration, what string, f func(context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, f); err != nil {
		t.Fatalf("wait for %s: %v", what, err)
	}
}

func echoContainer(probe *corev1.Probe) corev1.Container {
	return corev1.Container{
		Name:           "echo",
		Image:          "canopy/echo:latest",
		Command:        []string{"canopy-echo"},
		Args:           []string{"serve"},
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "tcp", ContainerPort: 9000}},
		ReadinessProbe: probe,
	}
}

func echoPod(name, node string, labels map[string]string, probe *corev1.Probe) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Containers:                    []corev1.Container{echoContainer(probe)},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
}

func echoService(name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: selector,
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("http")},
				{Name: "tcp", Port: 9000, TargetPort: intstr.FromInt32(9000)},
			},
		},
	}
}

// runningPod creates a pod and waits until it is Ready.
func runningPod(t *testing.T, c kubernetes.Interface, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	poll(t, 60*time.Second, "pod "+pod.Name+" ready", func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = p
		return podReady(p), nil
	})
	return got
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// get does an HTTP GET from the host (which routes to every pod CIDR); a
// request that fails gets code 0 and the error as its body.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// Code 0, for the caller's poll to try again: a pod without a
		// readiness probe is ready when its process starts, a moment
		// before it listens.
		return 0, fmt.Sprintf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// fetchFrom makes pod `from` GET target from inside its network namespace.
func fetchFrom(t *testing.T, from *corev1.Pod, target string) echo.Reply {
	t.Helper()
	var reply echo.Reply
	var last string
	// Service rules and DNS follow pods by a few hundred milliseconds.
	poll(t, 30*time.Second, "fetch "+target+" from "+from.Name, func(ctx context.Context) (bool, error) {
		code, body := get(t, "http://"+from.Status.PodIP+":8080/fetch?url="+url.QueryEscape(target))
		last = fmt.Sprintf("%d %s", code, body)
		return code == http.StatusOK && json.Unmarshal([]byte(body), &reply) == nil, nil
	})
	if reply.Name == "" {
		t.Fatalf("fetch %s: %s", target, last)
	}
	return reply
}

func TestPodsReachEachOtherAcrossNodes(t *testing.T) {
	c := need(t)
	t.Parallel()
	ns := namespace(t, c, "reach")
	a := runningPod(t, c, ns, echoPod("echo-a", "node-1", map[string]string{"app": "a"}, nil))
	b := runningPod(t, c, ns, echoPod("echo-b", "node-2", map[string]string{"app": "b"}, nil))
	if a.Spec.NodeName == b.Spec.NodeName {
		t.Fatalf("both pods on %s", a.Spec.NodeName)
	}
	if _, err := c.CoreV1().Services(ns).Create(t.Context(), echoService("echo-b", map[string]string{"app": "b"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// By pod IP, across nodes.
	if r := fetchFrom(t, a, "http://"+b.Status.PodIP+":8080/"); r.Hostname != "echo-b" {
		t.Errorf("by pod IP: answered by %q, want echo-b", r.Hostname)
	}
	// By Service name: cluster DNS, then the VIP through kube-proxy.
	fqdn := "echo-b." + ns + ".svc.cluster.local"
	r := fetchFrom(t, a, "http://"+fqdn+"/")
	if r.Hostname != "echo-b" || !strings.HasPrefix(r.RemoteAddr, a.Status.PodIP+":") {
		t.Errorf("by service name: answered by %q to %q, want echo-b to %s", r.Hostname, r.RemoteAddr, a.Status.PodIP)
	}
	// The short name resolves through the pod's search path.
	if r := fetchFrom(t, a, "http://echo-b/"); r.Hostname != "echo-b" {
		t.Errorf("by short name: answered by %q", r.Hostname)
	}
	// Plain TCP through the VIP.
	poll(t, 30*time.Second, "tcp echo through the VIP", func(ctx context.Context) (bool, error) {
		code, body := get(t, "http://"+a.Status.PodIP+":8080/dial?addr="+fqdn+":9000&msg=ping")
		return code == 200 && body == "ping", nil
	})
}

func TestDeploymentScalesToThreeReadyPods(t *testing.T) {
	c := need(t)
	t.Parallel()
	ns := namespace(t, c, "deploy")
	labels := map[string]string{"app": "web"}
	_, err := c.AppsV1().Deployments(ns).Create(t.Context(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{echoContainer(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 1})},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, 90*time.Second, "3 ready replicas", func(ctx context.Context) (bool, error) {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 3, nil
	})
	pods, err := c.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, p := range pods.Items {
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) != 2 {
		t.Errorf("3 replicas on nodes %v, want both nodes used", nodes)
	}
}

func TestFailingReadinessProbeRemovesEndpoint(t *testing.T) {
	c := need(t)
	t.Parallel()
	ns := namespace(t, c, "probe")
	probe := &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds:    1,
		FailureThreshold: 1,
	}
	pod := runningPod(t, c, ns, echoPod("flaky", "node-1", map[string]string{"app": "flaky"}, probe))
	if _, err := c.CoreV1().Services(ns).Create(t.Context(), echoService("flaky", map[string]string{"app": "flaky"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	endpointReady := func(ctx context.Context) (ready, found bool) {
		slices, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=flaky"})
		if err != nil {
			return false, false
		}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.UID == pod.UID {
					return ptr.Deref(ep.Conditions.Ready, false), true
				}
			}
		}
		return false, false
	}
	poll(t, 30*time.Second, "ready endpoint", func(ctx context.Context) (bool, error) {
		ready, _ := endpointReady(ctx)
		return ready, nil
	})

	resp, err := http.Post("http://"+pod.Status.PodIP+":8080/healthz/fail", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	poll(t, 30*time.Second, "endpoint no longer ready", func(ctx context.Context) (bool, error) {
		ready, _ := endpointReady(ctx)
		return !ready, nil
	})
	p, err := c.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if podReady(p) || p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod after failed readiness: phase %s, ready %v; want Running, not ready", p.Status.Phase, podReady(p))
	}
}

func TestDeletingPodRemovesNamespaceAndProcesses(t *testing.T) {
	c := need(t)
	t.Parallel()
	ns := namespace(t, c, "delete")
	pod := runningPod(t, c, ns, echoPod("doomed", "node-2", nil, nil))
	netnsPath := "/run/netns/cpod-" + string(pod.UID)
	pids := processesIn(t, netnsPath)
	if len(pids) == 0 {
		t.Fatalf("no process runs in %s", netnsPath)
	}
	// As on a real node, the pod's processes carry its UID in their
	// cgroup (a CNI agent finds the pod's namespace by it).
	podCgroup := "/kubepods/pod" + string(pod.UID) + "\n"
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), podCgroup) {
			t.Errorf("process %d of the pod is in cgroups %q, want one ending in %q", pid, b, podCgroup)
		}
	}
	if err := c.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "pod gone from the API", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	poll(t, 10*time.Second, "netns and processes gone", func(context.Context) (bool, error) {
		_, err := os.Stat(netnsPath)
		return os.IsNotExist(err) && !anyAlive(pids), nil
	})
}

func TestCrashingContainerRestartsWithBackoff(t *testing.T) {
	c := need(t)
	t.Parallel()
	ns := namespace(t, c, "crashloop")
	pod := echoPod("crasher", "node-1", nil, nil)
	// A port that does not parse: the server exits at once with an error.
	pod.Spec.Containers[0].Args = []string{"serve", "--http", "not-a-port"}
	if _, err := c.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last corev1.ContainerStatus
	poll(t, 60*time.Second, "two restarts", func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		last = p.Status.ContainerStatuses[0]
		return last.RestartCount >= 2, nil
	})
	if term := last.LastTerminationState.Terminated; term == nil || term.ExitCode == 0 {
		t.Errorf("last termination = %+v, want a non-zero exit", last.LastTerminationState)
	}
}

// TestDownAfterKilledUp kills every process of a cluster, as a crash or a
// reboot would, and checks that down still removes everything.
func TestDownAfterKilledUp(t *testing.T) {
	need(t)
	t.Parallel()
	cfg := testConfig("e2e-crash", 1, "10.97.0.0/24", "10.247.0.0/16")
	cl, err := localcluster.Up(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = localcluster.Down(context.Background(), cfg.StateDir) })
	ns := namespace(t, cl.Client, "crash")
	pod := echoPod("survivor", "node-1", nil, nil)
	if _, err := cl.Client.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podNetns string
	poll(t, 60*time.Second, "pod running", func(ctx context.Context) (bool, error) {
		p, err := cl.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return false, nil
		}
		podNetns = "/run/netns/cpod-" + string(p.UID)
		return true, nil
	})
	podPIDs := processesIn(t, podNetns)

	for _, p := range cl.State.Processes {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	if err := localcluster.Down(t.Context(), cfg.StateDir); err != nil {
		t.Fatalf("down after kill: %v", err)
	}

	for _, p := range append(cl.State.Processes, podProcesses(podPIDs)...) {
		if processAlive(p.PID) {
			t.Errorf("process %s (%d) survived down", p.Name, p.PID)
		}
	}
	for _, path := range append(cl.State.Netns, podNetns) {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("namespace %s survived down", path)
		}
	}
	for _, link := range append(cl.State.HostLinks, cl.State.Bridge) {
		if _, err := os.Stat("/sys/class/net/" + link); !os.IsNotExist(err) {
			t.Errorf("link %s survived down", link)
		}
	}
	if _, err := os.Stat(cfg.StateDir); !os.IsNotExist(err) {
		t.Errorf("state directory %s survived down", cfg.StateDir)
	}
}

func podProcesses(pids []int) []localcluster.Process {
	var out []localcluster.Process
	for _, pid := range pids {
		out = append(out, localcluster.Process{Name: "pod process", Process: procs.Process{PID: pid}})
	}
	return out
}

// processesIn lists the processes whose network namespace is at path.
func processesIn(t *testing.T, path string) []int {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == want.Ino {
			pids = append(pids, pid)
		}
	}
	return pids
}

func processAlive(pid int) bool {
	_, err := procs.Lookup(pid) // a zombie counts as gone
	return err == nil
}

func anyAlive(pids []int) bool {
	for _, p := range pids {
		if processAlive(p) {
			return true
		}
	}
	return false
}
