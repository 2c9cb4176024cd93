package parity

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/internal/testing/canopy"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/istiod"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

const (
	// systemNamespace is istiod's namespace and both control planes'
	// root namespace (mesh-wide policies) and system namespace.
	systemNamespace = "istio-system"
	// canopyNamespace holds Canopy's CA Secret and its subscriber's
	// service account.
	canopyNamespace = "canopy-system"
	// quiet is how long both tables must stay unchanged to count as
	// settled: longer than either side's debounce (istiod: 100 ms, up to
	// 10 s of steady change; Canopy here: 20 ms, up to 1 s).
	quiet = 3 * time.Second
	// settle bounds every wait of this test.
	settle = 90 * time.Second
)

// TestCanopyMatchesIstiod applies testdata/cluster.yaml to an API server
// that istiod and canopy-controller both watch, takes each one's workload
// xDS as a ztunnel would, and fails on every difference that
// testdata/allowlist.yaml does not list (and on listed ones that no longer
// occur).
func TestCanopyMatchesIstiod(t *testing.T) {
	testenv.Need(t, env)
	bins, err := istiod.FindBinaries("")
	if errors.Is(err, istiod.ErrUnavailable) {
		ci.Unavailable(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	allowList, err := readAllowList(filepath.Join("testdata", "allowlist.yaml"), "Address", "Authorization")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	start := time.Now()
	// The system namespace names the cluster's network (wire contract
	// §7.3), which both read.
	createNamespace(t, systemNamespace, map[string]string{"topology.istio.io/network": "net-1"})
	createNamespace(t, canopyNamespace, nil)

	canopyAddr, canopyReady := startCanopy(t)
	istiodStart := time.Now()
	ref, err := istiod.Start(ctx, istiod.Options{
		Binary: bins.PilotDiscovery, Kubeconfig: env.KubeconfigPath, Namespace: systemNamespace, Dir: t.TempDir(),
		// istiod withholds dry-run policies by default only because
		// ztunnels older than 1.29 would enforce them; Canopy's node
		// proxy never does, so the reference sends them too.
		Env: []string{"AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY=true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istiod ready in %s", time.Since(istiodStart).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if err := ref.Stop(); err != nil {
			t.Errorf("stop istiod: %v", err)
		}
		if t.Failed() {
			t.Logf("istiod log: %s", keepLog(t, ref.LogPath))
		}
	})
	eventually.Within(t, settle, "canopy-controller ready", canopyReady)

	fromIstiod := subscribeIstiod(t, ref.XDSAddr)
	fromCanopy := subscribeCanopy(t, canopyAddr)

	a, err := newApplier(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cluster.yaml", "proxyless.yaml", "traffic.yaml"} {
		if err := a.applyFile(ctx, filepath.Join("testdata", f)); err != nil {
			t.Fatalf("apply fixtures: %v", err)
		}
	}
	if err := waitAdopted(ctx, env.Client, "apps", "edge"); err != nil {
		t.Fatalf("ReplicaSets adopt their pods: %v", err)
	}
	waitQuiet(t, "both tables", fromIstiod, fromCanopy)
	compareViews(t, "", types, fromIstiod, fromCanopy, allowList, "testdata/allowlist.yaml")
	// Sidecar and proxyless EDS come from istiod's endpoint cache, whose
	// health of a terminating endpoint depends on the order istiod's
	// informers delivered a Service and its EndpointSlice.
	resynced := time.Now()
	if err := resyncEndpointSlices(ctx, env.Client, "apps", "edge", "rpc"); err != nil {
		t.Fatal(err)
	}
	waitQuietAfter(t, "both tables after the EndpointSlices' resync", resynced, fromIstiod, fromCanopy)
	t.Run("proxyless", func(t *testing.T) { compareProxyless(t, ref.XDSAddr, canopyAddr) })
	t.Run("sidecar", func(t *testing.T) { compareSidecars(t, ref.XDSAddr, canopyAddr) })
	t.Logf("compared in %s", time.Since(start).Round(100*time.Millisecond))
}

// createNamespace creates a namespace of a fixed name and waits for its
// default service account. The environment belongs to this package, so
// the names cannot clash.
func createNamespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx := t.Context()
	_, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	eventually.Within(t, settle, "service account "+name+"/default", func() bool {
		_, err := env.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

// startCanopy builds canopy-controller from the tree and runs it against
// the environment. It returns the TLS xDS address and a readiness check.
func startCanopy(t *testing.T) (string, func() bool) {
	t.Helper()
	dir := t.TempDir()
	bin, err := canopy.Build(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := canopy.Start(canopy.Options{Binary: bin, Kubeconfig: env.KubeconfigPath, CANamespace: canopyNamespace, Dir: dir,
		Args: []string{"--push-quiet=20ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop canopy-controller: %v", err)
		}
		if t.Failed() {
			t.Logf("canopy-controller log: %s", keepLog(t, c.LogPath))
		}
	})
	return c.SecureAddr, func() bool { return c.Ready(t.Context()) == nil }
}

// subscribeIstiod subscribes on istiod's plaintext port, which
// authenticates nobody.
func subscribeIstiod(t *testing.T, addr string) *subscriber {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	node, err := ztunnelNode(systemNamespace, "ztunnel-reference", "10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := subscribe(t.Context(), "istiod", conn, node, metadata.MD{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// subscribeCanopy subscribes over TLS, verifying the controller with the
// root it publishes, with a token of a ztunnel service account.
func subscribeCanopy(t *testing.T, addr string) *subscriber {
	t.Helper()
	ctx := t.Context()
	conn := dialCanopy(t, addr)
	if _, err := env.Client.CoreV1().ServiceAccounts(canopyNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ztunnel"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token, err := env.Token(ctx, canopyNamespace, "ztunnel", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	node, err := ztunnelNode(canopyNamespace, "ztunnel-canopy", "10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	s, err := subscribe(ctx, "canopy", conn, node, metadata.Pairs("authorization", "Bearer "+token, "clusterid", "Kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dialCanopy connects to Canopy's TLS xDS port, verifying the controller
// with the root it publishes.
func dialCanopy(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	roots, err := canopy.RootPool(t.Context(), env.Client, canopyNamespace, settle)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(canopy.Credentials(roots, canopyNamespace)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// keepLog copies a component's log out of the test's temporary directory,
// which is removed when the test ends, and returns where it went.
func keepLog(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	f, err := os.CreateTemp("", "parity-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Sprintf("(keep %s: %v)", path, err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return fmt.Sprintf("(keep %s: %v)", path, err)
	}
	return f.Name()
}
