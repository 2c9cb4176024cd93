package server

import (
	"crypto/x509"
	"log/slog"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
)

func TestServingCertRenewsAtHalfLife(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	clock := now
	s, err := NewServingCert(ca, []string{"canopy-controller.canopy-system.svc"}, 24*time.Hour, func() time.Time { return clock }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := s.GetCertificate(nil)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "canopy-controller.canopy-system.svc", Roots: roots, CurrentTime: clock}); err != nil {
		t.Fatalf("serving certificate does not verify for its name: %v", err)
	}
	if s.RenewDue() {
		t.Error("renewal due at once")
	}
	clock = now.Add(13 * time.Hour)
	if !s.RenewDue() {
		t.Error("renewal not due past half the lifetime")
	}
	if err := s.renew(); err != nil {
		t.Fatal(err)
	}
	if next, _ := s.GetCertificate(nil); next.Leaf.SerialNumber.Cmp(c.Leaf.SerialNumber) == 0 || s.RenewDue() {
		t.Error("renewal did not replace the certificate")
	}
}
