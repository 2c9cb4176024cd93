package server_test

import (
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	securityapi "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/server"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// BenchmarkCreateCertificate signs ECDSA P-256 leaves through the whole
// request path (token review against the real API server, identity,
// CSR checks, signing), with the TokenReview cache and without it.
func BenchmarkCreateCertificate(b *testing.B) {
	testenv.Need(b, env)
	ns := env.Namespace(b, "ca-bench", nil)
	pod, err := env.Client.CoreV1().Pods(ns).Create(b.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	token, err := env.Token(b.Context(), ns, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: pod})
	if err != nil {
		b.Fatal(err)
	}
	ca, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	csrPEM := csrFor(b)
	for _, cached := range []bool{true, false} {
		name := "uncached"
		if cached {
			name = "cached"
		}
		b.Run(name, func(b *testing.B) {
			a, err := authn.New(authn.Config{LocalCluster: "Kubernetes", DisableCache: !cached, ReviewQPS: -1,
				Clusters: map[string]authn.TokenReviewer{"Kubernetes": authn.Reviewer{Client: env.Client.AuthenticationV1()}}})
			if err != nil {
				b.Fatal(err)
			}
			srv, err := server.New(server.Config{}, a, identity.Decider{TrustDomain: "cluster.local", Pods: identity.APIPods{Client: env.Client}}, ca, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			ctx := metadata.NewIncomingContext(b.Context(), metadata.Pairs("authorization", "Bearer "+token))
			req := &securityapi.IstioCertificateRequest{Csr: csrPEM}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := srv.CreateCertificate(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
		})
	}
}
