package proxyless

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// serverIP is the echo pod's address; 127.0.77.x belong to the routing
// test.
const serverIP = "127.0.78.1"

// peers records the identities of the clients an xDS server served.
type peers struct {
	mu  sync.Mutex
	ids map[string]int
}

func (p *peers) record(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	id := "plaintext"
	if pr, ok := peer.FromContext(ctx); ok {
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 && len(ti.State.PeerCertificates[0].URIs) > 0 {
			id = ti.State.PeerCertificates[0].URIs[0].String()
		}
	}
	p.mu.Lock()
	p.ids[id]++
	p.mu.Unlock()
	return handler(ctx, req)
}

func (p *peers) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id]
}

// spiffeID reads the identity of the certificate in dir.
func spiffeID(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no certificate in cert-chain.pem")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.URIs) != 1 {
		t.Fatalf("certificate URIs = %v, want one SPIFFE ID", cert.URIs)
	}
	return cert.URIs[0].String()
}

// serveXDS runs an xDS-enabled grpc-go server (health service) for the
// proxyless pod n on ip:0, its security from the controller's server
// listener and n's certificate provider; it returns the port.
func serveXDS(t *testing.T, c *controller, n proxyNode, seen *peers) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(n.ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := xds.NewGRPCServer(grpc.Creds(creds), grpc.UnaryInterceptor(seen.record),
		xds.BootstrapContentsForTesting(bootstrap(t, c, n)),
		xds.ServingModeCallback(func(addr net.Addr, a xds.ServingModeChangeArgs) {
			t.Logf("xds server %s: %s (%v)", addr, a.Mode, a.Err)
		}))
	if err != nil {
		t.Fatal(err)
	}
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().(*net.TCPAddr).Port
}

// check makes one call and returns its status code.
func check(ctx context.Context, conn *grpc.ClientConn) codes.Code {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	return status.Code(err)
}

// TestProxylessServerMTLSAndRBAC: an xDS-enabled grpc-go server with a
// Canopy-issued certificate, under STRICT PeerAuthentication, accepts
// mutual TLS from a proxyless client holding its own Canopy-issued
// certificate and refuses a plaintext one; an AuthorizationPolicy that
// denies the client's principal, allows only another, or sends the called
// method to an external authorizer (CUSTOM, enforced as a DENY), makes
// calls fail with PermissionDenied until it is removed.
func TestProxylessServerMTLSAndRBAC(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	sys := env.Namespace(t, "canopy-system", nil)
	c := startController(t, sys)
	ns := env.Namespace(t, "secure", nil)
	for _, sa := range []string{"client", "echo"} {
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	cleanup := func(what string, del func(context.Context) error) {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := del(ctx); err != nil && !strings.Contains(err.Error(), "not found") {
				t.Errorf("delete %s: %v", what, err)
			}
		})
	}

	// STRICT for the echo pods, and ISTIO_MUTUAL for their callers.
	if _, err := istio.SecurityV1().PeerAuthentications(ns).Create(ctx, &securityv1.PeerAuthentication{
		ObjectMeta: metav1.ObjectMeta{Name: "strict"},
		Spec: securityapi.PeerAuthentication{
			Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}},
			Mtls:     &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cleanup("PeerAuthentication", func(ctx context.Context) error {
		return istio.SecurityV1().PeerAuthentications(ns).Delete(ctx, "strict", metav1.DeleteOptions{})
	})
	if _, err := istio.NetworkingV1().DestinationRules(ns).Create(ctx, &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: networkingapi.DestinationRule{Host: "echo", TrafficPolicy: &networkingapi.TrafficPolicy{
			Tls: &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_ISTIO_MUTUAL},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cleanup("DestinationRule", func(ctx context.Context) error {
		return istio.NetworkingV1().DestinationRules(ns).Delete(ctx, "echo", metav1.DeleteOptions{})
	})

	serverCerts, clientCerts := workloadCerts(t, c, ns, "echo"), workloadCerts(t, c, ns, "client")
	clientID := spiffeID(t, clientCerts)
	if want := "/ns/" + ns + "/sa/client"; !strings.HasSuffix(clientID, want) {
		t.Fatalf("client certificate identity %s, want one ending %s", clientID, want)
	}

	echoLabels := map[string]string{"app": "echo"}
	seen := &peers{ids: map[string]int{}}
	port := serveXDS(t, c, proxyNode{ns: ns, sa: "echo", name: "echo-0", ip: serverIP, labels: echoLabels, certDir: serverCerts}, seen)
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: echoLabels, Ports: []corev1.ServicePort{
			{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(int32(port))},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podAt(t, ns, "echo-0", serverIP, echoLabels)

	target := "xds:///echo." + ns + ".svc.cluster.local:7070"
	clientCreds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	clientBootstrap := bootstrap(t, c, proxyNode{ns: ns, sa: "client", name: "client", ip: "127.0.78.100", labels: map[string]string{"app": "client"}, certDir: clientCerts})
	conn := dialXDS(t, clientBootstrap, target, clientCreds)

	eventually.Within(t, settle, "a call over mutual TLS succeeds", func() bool {
		return check(ctx, conn) == codes.OK
	})
	if n := seen.count(clientID); n == 0 {
		t.Errorf("the server saw no call from %s; saw %v", clientID, seen.ids)
	}
	// A client whose transport ignores the cluster's TLS (plaintext
	// credentials, not xDS ones) cannot reach the STRICT server.
	plain := dialXDS(t, clientBootstrap, target, insecure.NewCredentials())
	if code := check(ctx, plain); code == codes.OK {
		t.Errorf("a plaintext call to a STRICT server: %v, want it refused", code)
	}

	principal := strings.TrimPrefix(clientID, "spiffe://")
	for _, tt := range []struct {
		name, policyName string
		policy           *securityapi.AuthorizationPolicy
	}{
		{"deny the client", "deny-client", &securityapi.AuthorizationPolicy{
			Selector: &typeapi.WorkloadSelector{MatchLabels: echoLabels},
			Action:   securityapi.AuthorizationPolicy_DENY,
			Rules:    []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Principals: []string{principal}}}}}},
		}},
		{"allow another principal", "allow-other", &securityapi.AuthorizationPolicy{
			Selector: &typeapi.WorkloadSelector{MatchLabels: echoLabels},
			Rules:    []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Principals: []string{"cluster.local/ns/" + ns + "/sa/someone-else"}}}}}},
		}},
		// The attack: a method protected by a CUSTOM policy (an external
		// authorizer no proxyless server can call) was served to anyone.
		{"CUSTOM on the called method", "custom-health", &securityapi.AuthorizationPolicy{
			Selector: &typeapi.WorkloadSelector{MatchLabels: echoLabels},
			Action:   securityapi.AuthorizationPolicy_CUSTOM,
			ActionDetail: &securityapi.AuthorizationPolicy_Provider{
				Provider: &securityapi.AuthorizationPolicy_ExtensionProvider{Name: "ext-authz"},
			},
			Rules: []*securityapi.Rule{{To: []*securityapi.Rule_To{{Operation: &securityapi.Operation{Paths: []string{"/grpc.health.v1.Health/*"}}}}}},
		}},
	} {
		name := tt.policyName
		if _, err := istio.SecurityV1().AuthorizationPolicies(ns).Create(ctx, &securityv1.AuthorizationPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: *tt.policy.DeepCopy(),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cleanup("AuthorizationPolicy "+name, func(ctx context.Context) error {
			return istio.SecurityV1().AuthorizationPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
		})
		eventually.Within(t, settle, tt.name+": calls fail with PermissionDenied", func() bool {
			return check(ctx, conn) == codes.PermissionDenied
		})
		if err := istio.SecurityV1().AuthorizationPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, settle, tt.name+": calls succeed once the policy is gone", func() bool {
			return check(ctx, conn) == codes.OK
		})
	}
	if n := c.nacks(t); n != "" {
		t.Errorf("a client or server rejected responses: %s", n)
	}
}
