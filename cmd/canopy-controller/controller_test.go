package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// settle is how long a condition of these tests may take to become true.
const settle = 60 * time.Second

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

// TestControllerServesWorkloadXDS runs the built binary against the API
// server: a proxy over TLS on the secure port (verifying the controller
// with the published root) and one over plaintext both receive a pod, and
// the monitoring port shows them.
func TestControllerServesWorkloadXDS(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	bin := filepath.Join(t.TempDir(), "canopy-controller")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	sys := env.Namespace(t, "canopy-system", nil)
	monitor, debugViews, secure, plain := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "--kubeconfig="+env.KubeconfigPath, "--monitoring-addr="+monitor, "--debug-addr="+debugViews, "--secure-addr="+secure, "--webhook-addr=",
		"--xds-addr="+plain, "--ca-namespace="+sys, "--cacerts-dir="+t.TempDir(), "--push-quiet=20ms", "--id=controller-under-test")
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
	// Health and metrics on the monitoring port, the views on the debug
	// port.
	get := func(path string) (int, string) {
		addr := monitor
		if strings.HasPrefix(path, "/debug/") {
			addr = debugViews
		}
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	eventually.Within(t, settle, "controller ready", func() bool { code, _ := get("/readyz"); return code == http.StatusOK })

	var root *corev1.ConfigMap
	eventually.Within(t, settle, "root ConfigMap published", func() bool {
		root, err = env.Client.CoreV1().ConfigMaps(sys).Get(ctx, rootcm.ConfigMapName, metav1.GetOptions{})
		return err == nil
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(root.Data[rootcm.Key])) {
		t.Fatalf("no certificate in %v", root.Data)
	}
	tlsConn, err := grpc.NewClient(secure, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "canopy-controller." + sys + ".svc", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer tlsConn.Close()
	plainConn, err := grpc.NewClient(plain, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plainConn.Close()

	token, err := env.Token(ctx, sys, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	var tables []*workloadtable.Table
	for i, conn := range []*grpc.ClientConn{tlsConn, plainConn} {
		md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": sys, "NODE_NAME": "node-1", "CLUSTER_ID": "Kubernetes"})
		tbl := workloadtable.New()
		c, err := xdsclient.New(xdsclient.Config{
			Conn: conn, Node: &corev3.Node{Id: fmt.Sprintf("ztunnel~10.0.0.%d~ztunnel-%d.%s~%s.svc.cluster.local", i+1, i, sys, sys), Metadata: md},
			Token: func(context.Context) (string, error) { return token, nil }, ClusterID: "Kubernetes", Handler: tbl,
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		tables = append(tables, tbl)
	}

	apps := env.Namespace(t, "apps", nil)
	if _, err := env.Client.CoreV1().Pods(apps).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "echo", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.77", PodIPs: []corev1.PodIP{{IP: "10.244.1.77"}}}})
	if _, err := env.Client.CoreV1().Pods(apps).Patch(ctx, "echo", types.MergePatchType, st, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	uid := workloadapi.PodUID("Kubernetes", apps, "echo")
	for i, tbl := range tables {
		eventually.Within(t, settle, fmt.Sprintf("proxy %d receives the pod", i), func() bool { return tbl.Workload(uid) != nil })
	}

	var status []xds.ProxyStatus
	eventually.Within(t, settle, "both proxies synced in /debug/syncz", func() bool {
		_, body := get("/debug/syncz")
		if json.Unmarshal([]byte(body), &status) != nil || len(status) != 2 {
			return false
		}
		for _, ps := range status {
			for _, ts := range ps.Types {
				if ts.Status != xds.Synced {
					return false
				}
			}
		}
		return true
	})
	if code, body := get("/debug/config_dump?proxyID=ztunnel-0." + sys); code != http.StatusOK || !strings.Contains(body, uid) {
		t.Errorf("config_dump: %d %.300s; want the pod's workload", code, body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, "canopy_xds_connected_proxies 2") || !strings.Contains(body, `canopy_xds_pushes_total{type="WDS"}`) {
		t.Errorf("metrics lack the xDS series:\n%.2000s", body)
	}
}
