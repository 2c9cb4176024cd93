package xds_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/tools"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// synczRow is what istioctl proxy-status reads of one CSDS ClientConfig
// (istioctl/pkg/writer/pilot/status.go): the node ID as NAME, the
// metadata's CLUSTER_ID, NAMESPACE and ISTIO_VERSION, and per type URL the
// config status, with "+age" when last_updated is set (istioctl then
// prints "SYNCED (<age>)").
type synczRow struct {
	ID, Cluster, Namespace, Version string
	Types                           map[string]string
}

func synczRows(t *testing.T, resources []*anypb.Any) []synczRow {
	t.Helper()
	var rows []synczRow
	for _, a := range resources {
		var cc statusv3.ClientConfig
		if err := a.UnmarshalTo(&cc); err != nil {
			t.Fatalf("resource %s: %v", a.GetTypeUrl(), err)
		}
		md := cc.GetNode().GetMetadata().GetFields()
		row := synczRow{
			ID: cc.GetNode().GetId(), Cluster: md["CLUSTER_ID"].GetStringValue(),
			Namespace: md["NAMESPACE"].GetStringValue(), Version: md["ISTIO_VERSION"].GetStringValue(),
			Types: map[string]string{},
		}
		for _, g := range cc.GetGenericXdsConfigs() {
			s := g.GetConfigStatus().String()
			if g.GetLastUpdated() != nil {
				s += "+age"
			}
			row.Types[g.GetTypeUrl()] = s
		}
		rows = append(rows, row)
	}
	return rows
}

// istioctlNode is the node istioctl's xDS client (pkg/adsc) sends: a
// sidecar placeholder ID, GENERATOR "event", the caller's service account
// and namespace, and a placeholder ISTIO_VERSION.
func istioctlNode(t *testing.T, ns string) *corev3.Node {
	t.Helper()
	md, err := structpb.NewStruct(map[string]any{
		"GENERATOR": "event", "SERVICE_ACCOUNT": "default", "NAMESPACE": ns, "ISTIO_VERSION": "65536.65536.65536",
	})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: fmt.Sprintf("sidecar~10.1.2.3~test-1.%s~%s.svc.cluster.local", ns, ns), Metadata: md}
}

// syncedMesh starts a mesh with one node proxy whose two types are ACKed.
func syncedMesh(t *testing.T, cfg xds.Config) (*mesh, []synczRow) {
	t.Helper()
	m := startMesh(t, cfg)
	m.connect(t, "ztunnel-a", "node-1", proxyOptions{})
	waitSynced(t, m)
	want := []synczRow{{
		ID: "ztunnel-a." + m.ns, Cluster: "Kubernetes", Namespace: m.ns, Version: "test",
		Types: map[string]string{workloadapi.AddressTypeURL: "SYNCED+age", workloadapi.AuthorizationTypeURL: "SYNCED+age"},
	}}
	return m, want
}

// waitSynced waits until the proxy has ACKed both types: a change the API
// server makes meanwhile (the test's namespace filling in) pushes again,
// and the proxy is STALE until it ACKs.
func waitSynced(t *testing.T, m *mesh) {
	t.Helper()
	eventually.Within(t, settle, "proxy synced", func() bool {
		for _, ps := range m.server.Status() {
			if ps.ProxyID == "ztunnel-a."+m.ns {
				return len(ps.Types) == 2 && ps.Types[0].Status == xds.Synced && ps.Types[1].Status == xds.Synced
			}
		}
		return false
	})
}

// askUntilSynced returns the difference between the syncz rows ask
// returns and the wanted ones, asking again while they differ (at most
// five times, each after waitSynced). Every ask must be answered, but its
// rows may show STALE when the API server changed something between
// waitSynced and the request (other tests' namespaces push to every
// proxy); a user reruns istioctl then, and so does the test.
func askUntilSynced(t *testing.T, m *mesh, ask func(attempt int) string) string {
	t.Helper()
	var diff string
	for attempt := range 5 {
		waitSynced(t, m)
		if diff = ask(attempt); diff == "" {
			break
		}
	}
	return diff
}

// TestSynczAsIstioctlAsks: istioctl proxy-status sends state-of-the-world
// requests with a response nonce on every one, its first included (pkg/adsc
// Send sets time.Now() as the nonce); every such request is answered, with
// one ClientConfig per proxy named by its proxy ID.
func TestSynczAsIstioctlAsks(t *testing.T) {
	m, want := syncedMesh(t, xds.Config{ID: "canopy-controller-0"})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last *discoveryv3.DiscoveryResponse
	for _, tc := range []struct {
		name string
		req  *discoveryv3.DiscoveryRequest
	}{
		{"first request, node and nonce", &discoveryv3.DiscoveryRequest{
			Node: istioctlNode(t, m.ns), TypeUrl: xds.SynczTypeURL, ResponseNonce: time.Now().String()}},
		{"second request, new nonce", &discoveryv3.DiscoveryRequest{
			TypeUrl: xds.SynczTypeURL, ResponseNonce: time.Now().String()}},
		{"request without nonce", &discoveryv3.DiscoveryRequest{TypeUrl: xds.SynczTypeURL}},
	} {
		diff := askUntilSynced(t, m, func(attempt int) string {
			req := tc.req
			if attempt > 0 {
				req = &discoveryv3.DiscoveryRequest{TypeUrl: xds.SynczTypeURL, ResponseNonce: time.Now().String()}
			}
			if err := st.Send(req); err != nil {
				t.Fatalf("%s: send: %v", tc.name, err)
			}
			resp, err := st.Recv()
			if err != nil {
				t.Fatalf("%s: no answer: %v", tc.name, err)
			}
			if resp.GetTypeUrl() != xds.SynczTypeURL {
				t.Errorf("%s: type %q, want %s", tc.name, resp.GetTypeUrl(), xds.SynczTypeURL)
			}
			last = resp
			return cmp.Diff(want, synczRows(t, resp.GetResources()))
		})
		if diff != "" {
			t.Errorf("%s: syncz mismatch (-want +got):\n%s", tc.name, diff)
		}
	}

	// The ACK of an answer (older istioctl releases ACK debug answers) is
	// not answered, or the two would ping-pong until the stream ends.
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xds.SynczTypeURL, ResponseNonce: last.GetNonce(), VersionInfo: last.GetVersionInfo()}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after an ACK: %d resources, %v; want the stream to end unanswered", len(resp.GetResources()), err)
	}
}

// TestSynczOverDelta: a syncz request over Delta ADS with a nonce is
// answered too; the resource is named by the proxy ID and the debug
// client itself, which watches no type, is not listed.
func TestSynczOverDelta(t *testing.T) {
	m, want := syncedMesh(t, xds.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// ask sends a syncz request with a fresh nonce and returns the rows.
	ask := func(what string) []synczRow {
		nonce := time.Now().String()
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: istioctlNode(t, m.ns), TypeUrl: xds.SynczTypeURL, ResponseNonce: nonce}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("%s, nonce %q: no answer: %v", what, nonce, err)
		}
		var names []string
		var anys []*anypb.Any
		for _, r := range resp.GetResources() {
			names, anys = append(names, r.GetName()), append(anys, r.GetResource())
		}
		if diff := cmp.Diff([]string{"ztunnel-a." + m.ns}, names); diff != "" {
			t.Errorf("%s: resource names (-want +got):\n%s", what, diff)
		}
		return synczRows(t, anys)
	}
	for _, what := range []string{"first request", "second request"} {
		if diff := askUntilSynced(t, m, func(int) string { return cmp.Diff(want, ask(what)) }); diff != "" {
			t.Errorf("%s: syncz mismatch (-want +got):\n%s", what, diff)
		}
	}
}

// istioctlBinary is an istioctl found in $CANOPY_ISTIO_BIN_DIR or Canopy's
// binary cache, or "" when there is none. It never builds one.
func istioctlBinary() string {
	var dirs []string
	if d := os.Getenv(tools.EnvVar("istio")); d != "" {
		dirs = append(dirs, d)
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".cache", "canopy", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "istioctl")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// TestIstioctlProxyStatus runs the real istioctl proxy-status against the
// controller's TLS xDS port, as an operator would with --xds-address.
func TestIstioctlProxyStatus(t *testing.T) {
	bin := istioctlBinary()
	if bin == "" {
		t.Skipf("no istioctl in $%s or ~/.cache/canopy/bin", tools.EnvVar("istio"))
	}
	m, _ := syncedMesh(t, xds.Config{ID: "canopy-controller-0"})
	addr := serveTLS(t, m)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "proxy-status", "--kubeconfig", env.KubeconfigPath,
		"--istioNamespace", m.ns, "--xds-address", addr)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("istioctl proxy-status: %v\n%s", err, out)
	}
	var row string
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "ztunnel-a."+m.ns+" ") {
			row = line
		}
	}
	// This istioctl prints the types a proxy subscribes to, not a per-type
	// sync state: both ambient types must be there.
	for _, want := range []string{"Kubernetes", "canopy-controller-0", "test", "2 (WADS,WDS)"} {
		if !strings.Contains(row, want) {
			t.Errorf("istioctl proxy-status row %q lacks %q; output:\n%s", row, want, out)
		}
	}
}

// serveTLS serves the mesh's xDS on a second loopback port over TLS with a
// throwaway certificate (istioctl does not verify it), and returns the
// address.
func serveTLS(t *testing.T, m *mesh) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "canopy-controller"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"istiod." + m.ns + ".svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12,
	})))
	m.server.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}
