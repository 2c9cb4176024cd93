package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// settle is how long a condition of these tests may take to become true.
const settle = 90 * time.Second

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// process runs a built binary for the test's lifetime, its output kept
// and shown on failure.
// process runs a built binary until the test ends or the returned stop
// is called (SIGTERM, then SIGKILL after 10s).
func process(t *testing.T, name string, args ...string) (stop func()) {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s (%s) log, %d bytes:\n%s", name, cmd.ProcessState, len(b), tail(string(b), 6000))
		}
	})
	return stop
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func build(t *testing.T, dir string, cmds ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range cmds {
		bin := filepath.Join(dir, c)
		if b, err := exec.Command("go", "build", "-o", bin, "../"+c).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, b)
		}
		out[c] = bin
	}
	return out
}

// TestWholeMesh runs the controller, and a CNI agent and a node proxy
// per node, as processes against the API server, with two pods in
// network namespaces on two nodes: the agents enroll them, the node
// proxies get them over ZDS, their identities from the CA and the tables
// over xDS; a connection between them crosses the pods' link as HBONE on
// 15008 only, and AuthorizationPolicies decide by the client's identity.
func TestWholeMesh(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	if testing.Short() {
		t.Skip("runs every component")
	}
	ctx := t.Context()
	dir := t.TempDir()
	bins := build(t, dir, "canopy-controller", "canopy-cni-agent", "canopy-cni", "canopy-node")
	c := env.Client
	sys := env.Namespace(t, "canopy-system", nil)
	apps := env.Namespace(t, "apps", map[string]string{"istio.io/dataplane-mode": "ambient"})
	run := time.Now().UnixNano() % 100000

	// A subnet of its own per run: pods bound to a node without a kubelet
	// linger as Terminating, and their IPs with them.
	subnet := netip.MustParsePrefix(fmt.Sprintf("10.224.%d.0/24", run%200))
	pods := nettest.NewPair(t, subnet)

	// The controller.
	monitor, secure, plain := freeAddr(t), freeAddr(t), freeAddr(t)
	process(t, "controller", bins["canopy-controller"], "--kubeconfig="+env.KubeconfigPath, "--monitoring-addr="+monitor,
		"--secure-addr="+secure, "--webhook-addr=", "--xds-addr="+plain, "--ca-namespace="+sys, "--cacerts-dir="+filepath.Join(dir, "none"),
		"--trusted-node-accounts="+sys+"/canopy-node", "--push-quiet=20ms",
		// Short certificates and quick reloads, so the root rotation below
		// completes (leaves re-issued under the new root) within the test.
		"--cert-min-ttl=1m", "--ca-reload-period=200ms")

	if _, err := c.CoreV1().ServiceAccounts(sys).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "canopy-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"client", "server"} {
		if _, err := c.CoreV1().ServiceAccounts(apps).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkPod := func(ns, name, sa, node string, ip netip.Addr) *corev1.Pod {
		if _, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "canopy/echo"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		st, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}})
		p, err := c.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, st, metav1.PatchOptions{}, "status")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// No kubelet confirms the deletion: force it.
			zero := int64(0)
			_ = c.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		return p
	}
	nodeA, nodeB := fmt.Sprintf("e2e-%d-a", run), fmt.Sprintf("e2e-%d-b", run)
	// Each pod runs a process in its namespace, in a cgroup carrying its
	// UID as a kubelet makes it: that is how the CNI agent finds a running
	// pod's namespace (its address is only a check).
	runPod(t, mkPod(apps, "client", "client", nodeA, pods.AddrA), pods.A, run)
	runPod(t, mkPod(apps, "server", "server", nodeB, pods.AddrB), pods.B, run)

	var root *corev1.ConfigMap
	var err error
	eventually.Within(t, settle, "root ConfigMap", func() bool {
		root, err = c.CoreV1().ConfigMaps(sys).Get(ctx, rootcm.ConfigMapName, metav1.GetOptions{})
		return err == nil
	})
	rootPath := filepath.Join(dir, "root-cert.pem")
	if err := os.WriteFile(rootPath, []byte(root.Data[rootcm.Key]), 0o644); err != nil {
		t.Fatal(err)
	}
	// The root file follows the ConfigMap, as a mounted ConfigMap volume
	// does (a new file renamed into place).
	go mirrorConfigMap(ctx, t, sys, rootcm.ConfigMapName, rootcm.Key, rootPath)

	// Per node: its proxy's pod and token, a CNI agent (host rules in a
	// namespace of their own) and a node proxy. The client's proxy
	// subscribes on demand: it holds its own node's workloads and must
	// look the server up before carrying the client's connection over
	// mTLS; the server's proxy holds the whole table.
	onDemandNode := nodeA
	admins := map[string]string{}
	proxies := map[string]func(int) func(){}
	stops := map[string]func(){}
	for i, node := range []string{nodeA, nodeB} {
		nd := filepath.Join(dir, node)
		confDir, binDir := filepath.Join(nd, "net.d"), filepath.Join(nd, "bin")
		_ = os.MkdirAll(confDir, 0o755)
		_ = os.MkdirAll(binDir, 0o755)
		_ = os.WriteFile(filepath.Join(confDir, "10-pods.conflist"), []byte(`{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"}]}`), 0o644)
		hostNS, err := netns.Create(fmt.Sprintf("cnp-e2e-%d-host%d", run, i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.DeletePath(hostNS) })
		proxyIP := netip.AddrFrom4([4]byte{10, 225, byte(run % 200), byte(10 + i)})
		proxyPod := mkPod(sys, "canopy-node-"+node, "canopy-node", node, proxyIP)
		token, err := env.Token(ctx, sys, "canopy-node", testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: proxyPod})
		if err != nil {
			t.Fatal(err)
		}
		tokenPath := filepath.Join(nd, "istio-token")
		if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		zdsSock := filepath.Join(nd, "ztunnel.sock")
		// The port guard's pins go in a BPF filesystem of the test's, whose
		// unmount detaches it: on the node's they would outlive the test,
		// a guard per run (the nodes' names are the run's).
		process(t, "cni-agent-"+node, bins["canopy-cni-agent"], "--kubeconfig="+env.KubeconfigPath, "--node-name="+node, "--cni-conf-dir="+confDir,
			"--cni-bin-dir="+binDir, "--plugin-binary="+bins["canopy-cni"], "--plugin-socket="+filepath.Join(nd, "cni.sock"),
			"--zds-socket="+zdsSock, "--probe-uid=0", "--host-netns="+hostNS, "--monitoring-addr="+freeAddr(t),
			"--system-namespace="+sys, "--reconcile-period=1s", "--guard-root="+filepath.Join(nettest.BPFFS(t), "guard"))
		startProxy := func(gen int) func() {
			admins[node] = freeAddr(t)
			args := []string{bins["canopy-node"], "--xds-address=" + secure, "--xds-server-name=canopy-controller." + sys + ".svc",
				"--root-cert=" + rootPath, "--token=" + tokenPath, "--zds-socket=" + zdsSock, "--node-name=" + node, "--pod-name=" + proxyPod.Name,
				"--pod-namespace=" + sys, "--instance-ip=" + proxyIP.String(), "--admin-addr=" + admins[node], "--metrics-addr=" + freeAddr(t),
				"--readiness-addr=" + freeAddr(t), "--drain-period=1s", "--cert-ttl=2m", "--root-cert-reload=200ms"}
			if node == onDemandNode {
				args = append(args, "--on-demand")
			}
			return process(t, fmt.Sprintf("node-%s-%d", node, gen), args...)
		}
		proxies[node] = startProxy
		stops[node] = startProxy(0)
	}

	// Each node proxy serves its pod with the pod's own identity, and sees
	// the pods it holds as HBONE workloads: both, or only its own on demand.
	for node, want := range map[string]string{nodeA: "client", nodeB: "server"} {
		eventually.Within(t, settle, "node proxy of "+node+" serves its pod over HBONE", func() bool {
			resp, err := http.Get("http://" + admins[node] + "/config_dump")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var d struct {
				Workloads []struct {
					Name, Namespace, Protocol string
				}
				Certificates []struct{ Identity string }
			}
			if json.NewDecoder(resp.Body).Decode(&d) != nil {
				return false
			}
			hbone := 0
			for _, w := range d.Workloads {
				if w.Namespace == apps && (w.Name == "client" || w.Name == "server") && w.Protocol == "HBONE" {
					hbone++
				}
			}
			held := 2
			if node == onDemandNode {
				held = 1
			}
			return hbone == held && len(d.Certificates) == 1 && d.Certificates[0].Identity == "spiffe://cluster.local/ns/"+apps+"/sa/"+want
		})
	}

	// Count what arrives at the server pod's link, then talk.
	script := "table inet canopy-test {\n chain count {\n  type filter hook prerouting priority -400; policy accept;\n  iifname != \"lo\" tcp dport 8080 counter\n  iifname != \"lo\" tcp dport 15008 counter\n }\n}\n"
	nettest.In(t, pods.B, func() ([]byte, error) {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		return cmd.CombinedOutput()
	})
	app := nettest.In(t, pods.B, func() (net.Listener, error) { return net.Listen("tcp4", ":8080") })
	defer app.Close()
	go func() {
		for {
			conn, err := app.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(conn, conn); conn.Close() }()
		}
	}()
	call := func() string {
		conn := nettest.In(t, pods.A, func() (net.Conn, error) {
			return net.DialTimeout("tcp4", pods.AddrB.String()+":8080", 3*time.Second)
		})
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write([]byte("across the mesh"))
		_ = conn.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(conn)
		return string(b)
	}
	eventually.Within(t, settle, "client on one node reaches server on the other", func() bool { return call() == "across the mesh" })
	out := nettest.In(t, pods.B, func() ([]byte, error) {
		return exec.Command("nft", "list", "chain", "inet", "canopy-test", "count").CombinedOutput()
	})
	count := func(port int) int {
		m := regexp.MustCompile(`tcp dport ` + strconv.Itoa(port) + ` counter packets (\d+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no counter for %d:\n%s", port, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if n := count(8080); n != 0 {
		t.Errorf("%d packets to the app port crossed the link; want only HBONE", n)
	}
	if count(15008) == 0 {
		t.Error("nothing crossed the link to 15008")
	}

	// AuthorizationPolicies, through the controller, decide by identity.
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	allowFrom := func(sa string) {
		pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "server-callers"}}
		pol.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "server"}}
		pol.Spec.Rules = []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{
			Principals: []string{"cluster.local/ns/" + apps + "/sa/" + sa}}}}}}
		cur, err := istio.SecurityV1().AuthorizationPolicies(apps).Get(ctx, pol.Name, metav1.GetOptions{})
		if err == nil {
			cur.Spec.Rules = pol.Spec.Rules
			_, err = istio.SecurityV1().AuthorizationPolicies(apps).Update(ctx, cur, metav1.UpdateOptions{})
		} else {
			_, err = istio.SecurityV1().AuthorizationPolicies(apps).Create(ctx, pol, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	allowFrom("someone-else")
	eventually.Within(t, settle, "a policy for another identity denies the client", func() bool { return call() == "" })
	allowFrom("client")
	eventually.Within(t, settle, "a policy for the client's identity allows it", func() bool { return call() == "across the mesh" })

	// A node proxy restart: the server's pod fails closed meanwhile, and
	// the new proxy serves it again from the agent's snapshot.
	stops[nodeB]()
	if got := call(); got != "" {
		t.Errorf("with the server's node proxy down the call returned %q; want it refused", got)
	}
	stops[nodeB] = proxies[nodeB](1)
	eventually.Within(t, settle, "the restarted node proxy serves the server again", func() bool { return call() == "across the mesh" })

	rotateRoot(t, sys, secure, admins, call)

	// Opting the server out: it leaves the mesh, and the client's traffic
	// reaches it as plain TCP on the app port.
	patch := []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":"none"}}}`)
	if _, err := c.CoreV1().Pods(apps).Patch(ctx, "server", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	before := count(8080)
	eventually.Within(t, settle, "the opted-out server is reached in plain TCP", func() bool {
		if call() != "across the mesh" {
			return false
		}
		out = nettest.In(t, pods.B, func() ([]byte, error) {
			return exec.Command("nft", "list", "chain", "inet", "canopy-test", "count").CombinedOutput()
		})
		return count(8080) > before
	})
}

// runPod starts a long-lived process for pod inside the network namespace
// at nsPath, in the cgroup <root>/canopy-e2e-<run>/kubepods/pod<uid>, and
// removes both when the test ends.
func runPod(t *testing.T, pod *corev1.Pod, nsPath string, run int64) {
	t.Helper()
	root, err := cgroup.Root()
	if err != nil {
		ci.Unavailable(t, "no cgroup v2 hierarchy: %v", err)
	}
	dir := filepath.Join(root, fmt.Sprintf("canopy-e2e-%d", run), "kubepods", "pod"+string(pod.UID))
	cmd := exec.Command("sleep", "infinity")
	if err := netns.Do(nsPath, func() error { return cgroup.Start(cmd, dir) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cgroup.Remove(filepath.Dir(filepath.Dir(dir)))
		_ = cmd.Wait()
	})
}
