package parity

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// The proxyless node: pod client-0 of testdata/proxyless.yaml.
const (
	grpcNamespace = "rpc"
	grpcPod       = "client-0"
	grpcAccount   = "client"
	grpcIP        = "10.244.3.10"
)

// grpcLabels are the pod's labels, which the node sends.
var grpcLabels = map[string]string{"app": "client", "version": "v1"}

// grpcListeners are the listener names the node asks for: the services
// of proxyless.yaml it calls, by full and short names, with and without a
// port; services of cluster.yaml in another namespace (a TCP port, a
// headless service) and ServiceEntry hosts; one that does not exist; and
// the server listeners of its own serving port (any address and its own)
// and of a port it does not serve.
var grpcListeners = []string{
	"greeter.rpc.svc.cluster.local:7070",
	"greeter:7070",
	"echo.rpc.svc.cluster.local",
	"web.apps.svc.cluster.local:9090",
	"protocols.apps.svc.cluster.local:2004",
	"web-headless.apps.svc.cluster.local:80",
	"static.example.com:80",
	"selected.apps.mesh:80",
	"missing.rpc.svc.cluster.local:7070",
	"xds.istio.io/grpc/lds/inbound/0.0.0.0:7070",
	"xds.istio.io/grpc/lds/inbound/10.244.3.10:7070",
	"xds.istio.io/grpc/lds/inbound/0.0.0.0:7071",
}

// compareProxyless subscribes to both control planes as the proxyless
// gRPC client of pod rpc/client-0 and fails on every difference of the
// four Envoy types that testdata/proxyless-allowlist.yaml does not list.
func compareProxyless(t *testing.T, istiodAddr, canopyAddr string) {
	allowPath := filepath.Join("testdata", "proxyless-allowlist.yaml")
	allowList, err := readAllowList(allowPath, "Listener", "RouteConfiguration", "Cluster", "ClusterLoadAssignment")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	node, err := grpcNode(grpcNamespace, grpcPod, grpcAccount, grpcIP, grpcLabels)
	if err != nil {
		t.Fatal(err)
	}

	istiodConn, canopyConn, canopyMD := envoyConnections(t, istiodAddr, canopyAddr, grpcNamespace, grpcAccount)
	fromIstiod, err := subscribeSotW(ctx, "istiod", istiodConn, node, metadata.MD{}, grpcListeners)
	if err != nil {
		t.Fatal(err)
	}
	fromCanopy, err := subscribeSotW(ctx, "canopy", canopyConn, node, canopyMD, grpcListeners)
	if err != nil {
		t.Fatal(err)
	}

	waitQuiet(t, "both proxyless views", fromIstiod, fromCanopy)
	compareViews(t, "proxyless ", envoyTypes, fromIstiod, fromCanopy, allowList, allowPath)
}

// envoyConnections connects to both control planes as a workload of
// namespace ns with service account sa: to istiod on its plaintext port,
// which authenticates nobody, and to Canopy over TLS with the account's
// token in the metadata it returns.
func envoyConnections(t *testing.T, istiodAddr, canopyAddr, ns, sa string) (istiod, canopy *grpc.ClientConn, canopyMD metadata.MD) {
	t.Helper()
	istiod, err := grpc.NewClient(istiodAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { istiod.Close() })
	token, err := env.Token(t.Context(), ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	return istiod, dialCanopy(t, canopyAddr), metadata.Pairs("authorization", "Bearer "+token, "clusterid", "Kubernetes")
}
