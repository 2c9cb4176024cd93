package server_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/server"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// anyone authenticates every token as shop/web.
type anyone struct{}

func (anyone) Authenticate(context.Context, string, string) (authn.Caller, error) {
	return authn.Caller{Cluster: "Kubernetes", Namespace: "shop", ServiceAccount: "web"}, nil
}

// own signs the caller's own identity.
type own struct{}

func (own) Decide(_ context.Context, c authn.Caller, _ string) (workloadapi.Identity, error) {
	return workloadapi.Identity{TrustDomain: "cluster.local", Namespace: c.Namespace, ServiceAccount: c.ServiceAccount}, nil
}

// TestLifetimeClamped: a requested lifetime is clamped into the CA's
// range, by default 10 minutes to 24 hours; none asked means 24 hours.
func TestLifetimeClamped(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca, err := pki.NewSelfSigned("cluster.local", 0, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Now: func() time.Time { return now }}, anyone{}, own{}, ca, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer t"))
	for _, tt := range []struct {
		name      string
		requested int64
		want      time.Duration
	}{
		{"none asked", 0, 24 * time.Hour},
		{"negative", -5, 24 * time.Hour},
		{"an hour", 3600, time.Hour},
		{"ninety days", 90 * 24 * 3600, 24 * time.Hour},
		{"a second", 1, 10 * time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := srv.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{Csr: csrFor(t), ValidityDuration: tt.requested})
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := pki.ParseCertificates([]byte(resp.GetCertChain()[0]))
			if err != nil {
				t.Fatal(err)
			}
			if got := leaf[0].NotAfter.Sub(now); got != tt.want {
				t.Errorf("lifetime of a %ds request = %s, want %s", tt.requested, got, tt.want)
			}
		})
	}
}
