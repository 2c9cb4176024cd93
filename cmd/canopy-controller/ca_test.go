package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/expiry"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/rootstore"
	"github.com/canopy-mesh/canopy/ca/server"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// podReads counts the requests for pods a client sends.
type podReads struct {
	mu    sync.Mutex
	reads []string
}

func (p *podReads) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/pods") {
			p.mu.Lock()
			p.reads = append(p.reads, r.URL.Path+"?"+r.URL.RawQuery)
			p.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (p *podReads) since(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.reads[n:]...)
}

func (p *podReads) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reads)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func csr(t *testing.T) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// caOptions vary startCA.
type caOptions struct {
	// register adds services to the CA's gRPC server.
	register func(*grpc.Server)
	// events receives the CA's Events.
	events expiry.Recorder
	// args are more flags.
	args []string
}

// startCA runs the CA with the default flags (but for its addresses and
// namespace) as run wires it, pods from the informers' index; it returns
// a client connection that trusts the CA's root.
func startCA(t *testing.T, kube kubernetes.Interface, sys string, o caOptions) *grpc.ClientConn {
	t.Helper()
	ctx := t.Context()
	addr := freeAddr(t)
	cfg, err := parseFlags(append([]string{"--secure-addr=" + addr, "--ca-namespace=" + sys, "--cacerts-dir=" + t.TempDir(),
		"--trusted-node-accounts=" + sys + "/canopy-node"}, o.args...))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	clients := kubeinput.Clients{Kube: kube}
	if clients.Istio, err = istioclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if clients.Gateway, err = gatewayclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	tables := index.New(cfg.mesh)
	watcher := kubeinput.New(clients, tables, nil, log)
	ca, err := newCA(ctx, cfg, kube, authn.Reviewer{Client: kube.AuthenticationV1()}, indexPods{tables: tables, synced: watcher.Synced()}, o.events, nil, func([]byte) {}, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	if o.register != nil {
		o.register(ca.grpc)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(runCtx)
	ca.start(gctx, g)
	g.Go(func() error { return watcher.Run(gctx) })
	t.Cleanup(func() { cancel(); _ = g.Wait() })
	// The listener opens in its own goroutine; a call before it does would
	// fail with Unavailable, which some tests expect for other reasons.
	eventually.Within(t, settle, "the CA listening on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return dialCA(t, addr, sys, rootOf(t, sys))
}

// dialCA opens a connection to the CA at addr, trusting root.
func dialCA(t *testing.T, addr, sys string, root []byte) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(root)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "canopy-controller." + sys + ".svc", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestImpersonationReadsNoPods: the CA as the controller wires it signs a
// node proxy's impersonated certificates from its informers' view of the
// pods, without reading pods from the API server per certificate.
func TestImpersonationReadsNoPods(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	sys := env.Namespace(t, "canopy-system", nil)
	apps := env.Namespace(t, "apps", nil)
	c := env.Client
	if _, err := c.CoreV1().ServiceAccounts(sys).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "canopy-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkPod := func(ns, name, sa string) *corev1.Pod {
		p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	proxy := mkPod(sys, "canopy-node-a", "canopy-node")
	mkPod(apps, "web", "default")

	reads := &podReads{}
	rc := rest.CopyConfig(env.Config)
	rc.Wrap(reads.wrap)
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	conn := startCA(t, kube, sys, caOptions{})
	token, err := env.Token(ctx, sys, "canopy-node", testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: proxy})
	if err != nil {
		t.Fatal(err)
	}
	client := securityapi.NewIstioCertificateServiceClient(conn)
	call := func() error {
		cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		md, _ := structpb.NewStruct(map[string]any{server.MetadataImpersonatedIdentity: "spiffe://cluster.local/ns/" + apps + "/sa/default"})
		_, err := client.CreateCertificate(cctx, &securityapi.IstioCertificateRequest{Csr: csr(t), ValidityDuration: 3600, Metadata: md})
		return err
	}
	// The informers may still be listing: wait for a first certificate.
	deadline := time.Now().Add(30 * time.Second)
	for err := call(); err != nil; err = call() {
		if time.Now().After(deadline) {
			t.Fatalf("no impersonated certificate: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := reads.len()
	for range 20 {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads.since(before); len(got) != 0 {
		t.Errorf("20 impersonated certificates read pods from the API server %d times, want none:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// TestSecurePortCapsStreamsPerConnection: one connection to the secure
// port carries at most 100 concurrent streams by default; the next waits
// for one to end (the transport's flow control, not an error), while a
// new connection is served.
func TestSecurePortCapsStreamsPerConnection(t *testing.T) {
	testenv.Need(t, env)
	sys := env.Namespace(t, "canopy-system", nil)
	conn := startCA(t, env.Client, sys, caOptions{register: func(g *grpc.Server) { healthpb.RegisterHealthServer(g, health.NewServer()) }})
	watch := func(conn *grpc.ClientConn, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		st, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if err != nil {
			cancel()
			return err
		}
		t.Cleanup(cancel) // the stream stays open until the test ends
		return nil
	}
	for i := range 100 {
		if err := watch(conn, 20*time.Second); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if err := watch(conn, 2*time.Second); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("101st stream on one connection: %v, want it held back (DeadlineExceeded)", err)
	}
	if err := watch(dialCA(t, conn.Target(), sys, rootOf(t, sys)), 20*time.Second); err != nil {
		t.Errorf("stream on a second connection: %v", err)
	}
}

func rootOf(t *testing.T, sys string) []byte {
	t.Helper()
	secret, err := env.Client.CoreV1().Secrets(sys).Get(t.Context(), rootstore.SelfSignedSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return secret.Data[rootstore.KeyRootCert]
}

// TestCAExpiryReported: a CA certificate near its end is reported as a
// Warning Event on its Secret; one with less than a certificate's minimum
// lifetime left refuses to sign (Unavailable) and says so on the Secret.
func TestCAExpiryReported(t *testing.T) {
	testenv.Need(t, env)
	for _, tt := range []struct {
		name      string
		left      time.Duration
		reason    string
		wantError bool
	}{
		{"ten days left", 10 * 24 * time.Hour, expiry.ReasonExpiringSoon, false},
		{"five minutes left", 5 * time.Minute, expiry.ReasonUnusable, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			sys := env.Namespace(t, "canopy-system", nil)
			ca, err := pki.NewSelfSigned("cluster.local", tt.left, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			key, err := pki.EncodeKey(ca.Key)
			if err != nil {
				t.Fatal(err)
			}
			cert := pki.EncodeCertificates(ca.Cert)
			if _, err := env.Client.CoreV1().Secrets(sys).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: rootstore.SelfSignedSecret}, Type: rootstore.SecretType,
				Data: map[string][]byte{rootstore.KeyCACert: cert, rootstore.KeyCAKey: key, rootstore.KeyRootCert: cert},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			broadcaster := record.NewBroadcaster(record.WithContext(ctx))
			t.Cleanup(broadcaster.Shutdown)
			broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events("")})
			conn := startCA(t, env.Client, sys, caOptions{events: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "canopy-controller"})})

			token, err := env.Token(ctx, sys, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
			if err != nil {
				t.Fatal(err)
			}
			cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
			_, err = securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(cctx, &securityapi.IstioCertificateRequest{Csr: csr(t)})
			if tt.wantError != (status.Code(err) == codes.Unavailable) || !tt.wantError && err != nil {
				t.Errorf("CreateCertificate() = %v; want Unavailable: %v", err, tt.wantError)
			}
			eventually.Within(t, settle, "a Warning Event "+tt.reason+" on the CA Secret", func() bool {
				evs, err := env.Client.CoreV1().Events(sys).List(ctx, metav1.ListOptions{})
				if err != nil {
					return false
				}
				for _, e := range evs.Items {
					if e.InvolvedObject.Kind == "Secret" && e.InvolvedObject.Name == rootstore.SelfSignedSecret &&
						e.Type == corev1.EventTypeWarning && e.Reason == tt.reason {
						return true
					}
				}
				return false
			})
		})
	}
}
