package server_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/server"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func csr(t *testing.T) string { return csrFor(t) }

func csrFor(t testing.TB) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// TestCreateCertificateOverGRPC calls the CA with a client built from the
// istio.io/api stubs over a real gRPC connection, with real tokens.
func TestCreateCertificateOverGRPC(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	c := env.Client
	ns := env.Namespace(t, "ca-grpc", nil)
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "canopy-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkPod := func(name, sa string) *corev1.Pod {
		p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	proxy := mkPod("proxy", "canopy-node")
	mkPod("web", "default")

	ca, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, err := authn.New(authn.Config{LocalCluster: "Kubernetes", Clusters: map[string]authn.TokenReviewer{"Kubernetes": authn.Reviewer{Client: c.AuthenticationV1()}}})
	if err != nil {
		t.Fatal(err)
	}
	d := identity.Decider{TrustDomain: "cluster.local", TrustedNodeAccounts: []identity.Account{{Namespace: ns, Name: "canopy-node"}}, Pods: identity.APIPods{Client: c}}
	srv, err := server.New(server.Config{}, a, d, ca, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Real TLS, as on 15012: the server presents a certificate of its own
	// CA for its Service name; the client trusts only the root bundle.
	serving, err := server.NewServingCert(ca, []string{"canopy-controller.canopy-system.svc"}, time.Hour, time.Now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{GetCertificate: serving.GetCertificate, MinVersion: tls.VersionTLS12})),
		grpc.MaxRecvMsgSize(1<<20))
	securityapi.RegisterIstioCertificateServiceServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	bundle := x509.NewCertPool()
	bundle.AppendCertsFromPEM(pki.EncodeCertificates(ca.Roots...))
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: bundle, ServerName: "canopy-controller.canopy-system.svc", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := securityapi.NewIstioCertificateServiceClient(conn)

	tok := func(sa string, p *corev1.Pod) string {
		s, err := env.Token(ctx, ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: p})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	call := func(token, csrPEM, impersonate string) (*securityapi.IstioCertificateResponse, error) {
		cctx := ctx
		if token != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "clusterid", "Kubernetes")
		}
		req := &securityapi.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 3600}
		if impersonate != "" {
			req.Metadata, _ = structpb.NewStruct(map[string]any{server.MetadataImpersonatedIdentity: impersonate})
		}
		return client.CreateCertificate(cctx, req)
	}

	resp, err := call(tok("default", nil), csr(t), "")
	if err != nil {
		t.Fatal(err)
	}
	leaf := verify(t, resp.GetCertChain(), ca)
	if got, want := leaf.URIs[0].String(), "spiffe://cluster.local/ns/"+ns+"/sa/default"; got != want {
		t.Errorf("URI SAN = %s, want %s", got, want)
	}
	resp, err = call(tok("canopy-node", proxy), csr(t), "spiffe://cluster.local/ns/"+ns+"/sa/default")
	if err != nil {
		t.Fatalf("impersonation: %v", err)
	}
	if leaf := verify(t, resp.GetCertChain(), ca); leaf.URIs[0].String() != "spiffe://cluster.local/ns/"+ns+"/sa/default" {
		t.Errorf("impersonated URI SAN = %s", leaf.URIs[0])
	}

	for _, tt := range []struct {
		name        string
		token, csr  string
		impersonate string
		code        codes.Code
	}{
		{"no token", "", csr(t), "", codes.Unauthenticated},
		{"garbage token", "garbage", csr(t), "", codes.Unauthenticated},
		{"malformed csr", tok("default", nil), "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "", codes.InvalidArgument},
		{"untrusted impersonation", tok("default", nil), csr(t), "spiffe://cluster.local/ns/" + ns + "/sa/canopy-node", codes.Unauthenticated},
		{"pod on no node", tok("canopy-node", proxy), csr(t), "spiffe://cluster.local/ns/" + ns + "/sa/ghost", codes.Unauthenticated},
		{"oversized request", tok("default", nil), strings.Repeat("x", 100<<10), "", codes.ResourceExhausted},
	} {
		_, err := call(tt.token, tt.csr, tt.impersonate)
		if status.Code(err) != tt.code {
			t.Errorf("%s: %v, want code %s", tt.name, err, tt.code)
		}
	}
	for reason, want := range map[string]float64{
		"ok": 2, "no_token": 1, "token_rejected": 1, "csr_malformed": 1,
		"impersonation_untrusted_account": 1, "impersonation_no_pod_on_node": 1, "request_too_large": 1,
	} {
		if got := testutil.ToFloat64(srv.Requests().WithLabelValues(reason)); got != want {
			t.Errorf("requests{result=%q} = %v, want %v", reason, got, want)
		}
	}
}

func verify(t *testing.T, chain []string, ca *pki.Authority) *x509.Certificate {
	t.Helper()
	if len(chain) != 2 {
		t.Fatalf("chain of %d, want leaf and root", len(chain))
	}
	leaf, err := pki.ParseCertificates([]byte(chain[0]))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Roots[0])
	if _, err := leaf[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("chain does not verify: %v", err)
	}
	return leaf[0]
}
