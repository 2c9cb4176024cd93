package server_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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

// alarm records what it hears.
type alarm struct{ heard []error }

func (a *alarm) CAUnusable(err error) { a.heard = append(a.heard, err) }

// TestCAOutsideItsValidity: a CA whose certificate cannot cover a
// certificate's minimum lifetime refuses with Unavailable, counts the
// refusal by cause and raises its alarm.
func TestCAOutsideItsValidity(t *testing.T) {
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca, err := pki.NewSelfSigned("cluster.local", 24*time.Hour, start) // start-1m to start+24h
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer t"))
	for _, tt := range []struct {
		name   string
		at     time.Time
		result string
	}{
		{"valid", start.Add(time.Hour), "ok"},
		{"expired", start.Add(25 * time.Hour), "ca_expired"},
		{"less than the minimum lifetime left", start.Add(24*time.Hour - 5*time.Minute), "ca_expiring"},
		{"not yet valid", start.Add(-time.Hour), "ca_not_yet_valid"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			al := &alarm{}
			srv, err := server.New(server.Config{Now: func() time.Time { return tt.at }, Alarm: al}, anyone{}, own{}, ca, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			_, err = srv.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{Csr: csrFor(t)})
			wantCode, wantAlarms := codes.Unavailable, 1
			if tt.result == "ok" {
				wantCode, wantAlarms = codes.OK, 0
			}
			if status.Code(err) != wantCode {
				t.Errorf("CreateCertificate() = %v, want %s", err, wantCode)
			}
			if got := testutil.ToFloat64(srv.Requests().WithLabelValues(tt.result)); got != 1 {
				t.Errorf("requests{result=%q} = %v, want 1", tt.result, got)
			}
			if len(al.heard) != wantAlarms {
				t.Errorf("alarm heard %v, want %d", al.heard, wantAlarms)
			}
		})
	}
}
