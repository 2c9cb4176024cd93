package proxyless

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/tools"
)

// settle bounds how long a change may take to reach the client.
const settle = 60 * time.Second

// controller is a canopy-controller process serving the test environment.
type controller struct {
	secure, monitor string
	root            []byte
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startController builds and runs canopy-controller with its CA's serving
// certificate valid for "localhost", the name the client dials.
func startController(t *testing.T, sys string) *controller {
	t.Helper()
	root, err := tools.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "canopy-controller")
	build := exec.Command("go", "build", "-o", bin, "./cmd/canopy-controller")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	c := &controller{secure: freeAddr(t), monitor: freeAddr(t)}
	cmd := exec.Command(bin, "--kubeconfig="+env.KubeconfigPath, "--monitoring-addr="+c.monitor, "--debug-addr="+freeAddr(t),
		"--secure-addr="+c.secure, "--ca-namespace="+sys, "--cacerts-dir="+t.TempDir(), "--ca-dns-names=localhost",
		"--push-quiet=20ms")
	logs, err := os.Create(filepath.Join(t.TempDir(), "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("controller log:\n%s", b)
		}
	})
	eventually.Within(t, settle, "root ConfigMap published", func() bool {
		cm, err := env.Client.CoreV1().ConfigMaps(sys).Get(t.Context(), rootcm.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		c.root = []byte(cm.Data[rootcm.Key])
		return len(c.root) > 0
	})
	return c
}

// nacks reads canopy_xds_nacks_total from the controller's metrics.
func (c *controller) nacks(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + c.monitor + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "canopy_xds_nacks_total{") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "; ")
}

// serveBackends listens on n loopback addresses with one port, each a
// gRPC server with the health service (which callers address by port,
// the peer telling which pod answered).
func serveBackends(t *testing.T, n int) ([]string, int) {
	t.Helper()
	var ips []string
	var port int
	for i := range n {
		ip := fmt.Sprintf("127.0.77.%d", i+1)
		l, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		if err != nil {
			t.Fatal(err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() { _ = s.Serve(l) }()
		t.Cleanup(s.Stop)
		ips = append(ips, ip)
	}
	return ips, port
}

// podAt creates a running, ready pod at ip.
func podAt(t *testing.T, ns, name, ip string, lbls map[string]string) {
	t.Helper()
	ctx := t.Context()
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec:       corev1.PodSpec{ServiceAccountName: "echo", Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	status, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}})
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// xdsClient is a grpc-go channel to target through grpc-go's xDS
// resolver, bootstrapped as Istio's proxyless clients are but without the
// agent: TLS to the controller trusting the mesh root, and a service
// account token as call credentials.
func xdsClient(t *testing.T, c *controller, ns, sa, target string) *grpc.ClientConn {
	t.Helper()
	dir := t.TempDir()
	token, err := env.Token(t.Context(), ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	rootFile, tokenFile := filepath.Join(dir, "root-cert.pem"), filepath.Join(dir, "istio-token")
	if err := os.WriteFile(rootFile, c.root, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(c.secure)
	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      "localhost:" + port,
			"channel_creds":   []any{map[string]any{"type": "tls", "config": map[string]any{"ca_certificate_file": rootFile}}},
			"call_creds":      []any{map[string]any{"type": "jwt_token_file", "config": map[string]any{"jwt_token_file": tokenFile}}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id": "sidecar~127.0.77.100~client." + ns + "~" + ns + ".svc.cluster.local",
			"metadata": map[string]any{
				"GENERATOR": "grpc", "NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "CLUSTER_ID": "Kubernetes",
				"INSTANCE_IPS": "127.0.77.100", "LABELS": map[string]string{"app": "client"},
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// calls makes n calls (with headers, if any) and counts them by the
// address that answered; failures count under "error: ...".
func calls(ctx context.Context, conn *grpc.ClientConn, n int, headers ...string) map[string]int {
	got := map[string]int{}
	client := healthpb.NewHealthClient(conn)
	for range n {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if len(headers) > 0 {
			cctx = metadata.AppendToOutgoingContext(cctx, headers...)
		}
		var p peer.Peer
		_, err := client.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
		cancel()
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		host, _, _ := net.SplitHostPort(p.Addr.String())
		got[host]++
	}
	return got
}

// TestProxylessClientRouting: grpc-go's xDS client, subscribed to
// canopy-controller as a proxyless gRPC application, reaches a Service's
// pods; a DestinationRule's subsets and a VirtualService's header match
// and weights then decide which pod answers.
func TestProxylessClientRouting(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	sys := env.Namespace(t, "canopy-system", nil)
	c := startController(t, sys)
	ns := env.Namespace(t, "apps", nil)
	for _, sa := range []string{"client", "echo"} {
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ips, port := serveBackends(t, 2)
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{
			{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(int32(port))},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podAt(t, ns, "echo-v1", ips[0], map[string]string{"app": "echo", "version": "v1"})
	podAt(t, ns, "echo-v2", ips[1], map[string]string{"app": "echo", "version": "v2"})

	conn := xdsClient(t, c, ns, "client", "xds:///echo."+ns+".svc.cluster.local:7070")
	v1, v2 := ips[0], ips[1]

	eventually.Within(t, settle, "calls reach both pods", func() bool {
		got := calls(ctx, conn, 20)
		return got[v1] > 0 && got[v2] > 0
	})

	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := istio.NetworkingV1().DestinationRules(ns).Create(ctx, &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: networkingapi.DestinationRule{Host: "echo", Subsets: []*networkingapi.Subset{
			{Name: "v1", Labels: map[string]string{"version": "v1"}},
			{Name: "v2", Labels: map[string]string{"version": "v2"}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dest := func(subset string, weight int32) *networkingapi.HTTPRouteDestination {
		return &networkingapi.HTTPRouteDestination{Destination: &networkingapi.Destination{Host: "echo", Subset: subset}, Weight: weight}
	}
	if _, err := istio.NetworkingV1().VirtualServices(ns).Create(ctx, &networkingv1.VirtualService{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: networkingapi.VirtualService{Hosts: []string{"echo"}, Http: []*networkingapi.HTTPRoute{
			{
				Name:  "canary",
				Match: []*networkingapi.HTTPMatchRequest{{Headers: map[string]*networkingapi.StringMatch{"x-canary": {MatchType: &networkingapi.StringMatch_Exact{Exact: "yes"}}}}},
				Route: []*networkingapi.HTTPRouteDestination{dest("v2", 0)},
			},
			{Name: "split", Route: []*networkingapi.HTTPRouteDestination{dest("v1", 90), dest("v2", 10)}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The header match sends every call to v2.
	eventually.Within(t, settle, "calls with x-canary: yes all reach v2", func() bool {
		got := calls(ctx, conn, 20, "x-canary", "yes")
		return got[v2] == 20
	})
	// The split: 90 to 10. Of 400 calls v2 takes 40 on average (standard
	// deviation 6); between 10 and 90 is far outside chance.
	got := calls(ctx, conn, 400)
	if got[v1]+got[v2] != 400 || got[v2] < 10 || got[v2] > 90 {
		t.Errorf("400 calls under a 90/10 split: %v; want all answered, v2 (%s) taking 10 to 90", got, v2)
	}
	if n := c.nacks(t); n != "" {
		t.Errorf("the client rejected responses: %s", n)
	}
}
