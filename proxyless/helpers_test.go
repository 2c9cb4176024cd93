package proxyless

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
	capb "istio.io/api/security/v1alpha1"
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
		"--secure-addr="+c.secure, "--webhook-addr=", "--ca-namespace="+sys, "--cacerts-dir="+t.TempDir(), "--ca-dns-names=localhost",
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

// proxyNode is the proxyless application a bootstrap speaks for.
type proxyNode struct {
	ns, sa, name, ip string
	labels           map[string]string
	// certDir, if set, holds cert-chain.pem, key.pem and root-cert.pem for
	// the bootstrap's file_watcher certificate provider "default".
	certDir string
}

// bootstrap is a grpc-go xDS bootstrap as Istio's agent writes it, but
// without the agent: TLS to the controller trusting the mesh root, and a
// service account token as call credentials.
func bootstrap(t *testing.T, c *controller, n proxyNode) []byte {
	t.Helper()
	dir := t.TempDir()
	token, err := env.Token(t.Context(), n.ns, n.sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}})
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
	b := map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      "localhost:" + port,
			"channel_creds":   []any{map[string]any{"type": "tls", "config": map[string]any{"ca_certificate_file": rootFile}}},
			"call_creds":      []any{map[string]any{"type": "jwt_token_file", "config": map[string]any{"jwt_token_file": tokenFile}}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id": "sidecar~" + n.ip + "~" + n.name + "." + n.ns + "~" + n.ns + ".svc.cluster.local",
			"metadata": map[string]any{
				"GENERATOR": "grpc", "NAMESPACE": n.ns, "SERVICE_ACCOUNT": n.sa, "CLUSTER_ID": "Kubernetes",
				"INSTANCE_IPS": n.ip, "LABELS": n.labels,
			},
		},
		"server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
	}
	if n.certDir != "" {
		b["certificate_providers"] = map[string]any{"default": map[string]any{
			"plugin_name": "file_watcher",
			"config": map[string]any{
				"certificate_file":    filepath.Join(n.certDir, "cert-chain.pem"),
				"private_key_file":    filepath.Join(n.certDir, "key.pem"),
				"ca_certificate_file": filepath.Join(n.certDir, "root-cert.pem"),
				"refresh_interval":    "900s",
			},
		}}
	}
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dialXDS is a grpc-go channel to target through grpc-go's xDS resolver
// bootstrapped with bootstrap.
func dialXDS(t *testing.T, bootstrap []byte, target string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// xdsClient is a plaintext proxyless client at 127.0.77.100 with service
// account sa calling target.
func xdsClient(t *testing.T, c *controller, ns, sa, target string) *grpc.ClientConn {
	t.Helper()
	b := bootstrap(t, c, proxyNode{ns: ns, sa: sa, name: "client", ip: "127.0.77.100", labels: map[string]string{"app": "client"}})
	return dialXDS(t, b, target, insecure.NewCredentials())
}

// workloadCerts asks the controller's CA for a certificate of service
// account ns/sa, as Istio's agent does with the account's token, and
// writes it where a file_watcher certificate provider reads it:
// cert-chain.pem, key.pem and root-cert.pem in the returned directory.
func workloadCerts(t *testing.T, c *controller, ns, sa string) string {
	t.Helper()
	ctx := t.Context()
	token, err := env.Token(ctx, ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.root) {
		t.Fatal("no root certificate in the root ConfigMap")
	}
	_, port, _ := net.SplitHostPort(c.secure)
	conn, err := grpc.NewClient("localhost:"+port, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), 10*time.Second)
	defer cancel()
	resp, err := capb.NewIstioCertificateServiceClient(conn).CreateCertificate(cctx, &capb.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
		ValidityDuration: 3600,
	})
	if err != nil {
		t.Fatalf("CreateCertificate for %s/%s: %v", ns, sa, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"cert-chain.pem": []byte(strings.Join(resp.GetCertChain(), "")),
		"key.pem":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"root-cert.pem":  c.root,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
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

// echoApp creates a namespace with service accounts "client" and "echo",
// n loopback gRPC backends and Service "echo" (port 7070 to the backends'
// port, selecting app=echo); it returns the namespace and the backends'
// addresses, at which the caller creates the pods.
func echoApp(t *testing.T, n int) (string, []string) {
	t.Helper()
	ctx := t.Context()
	ns := env.Namespace(t, "apps", nil)
	for _, sa := range []string{"client", "echo"} {
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ips, port := serveBackends(t, n)
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{
			{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(int32(port))},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns, ips
}
