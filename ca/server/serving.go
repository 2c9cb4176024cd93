package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
)

// ServingCert keeps the CA server's own TLS certificate, issued by the CA
// for its Service names and renewed at half its lifetime. It is safe for
// concurrent use; GetCertificate plugs into tls.Config.
type ServingCert struct {
	dnsNames []string
	ttl      time.Duration
	now      func() time.Time
	log      *slog.Logger

	mu   sync.RWMutex
	ca   *pki.Authority
	cert *tls.Certificate
}

// NewServingCert issues the first certificate.
func NewServingCert(ca *pki.Authority, dnsNames []string, ttl time.Duration, now func() time.Time, log *slog.Logger) (*ServingCert, error) {
	s := &ServingCert{ca: ca, dnsNames: dnsNames, ttl: ttl, now: now, log: log}
	if err := s.renew(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *ServingCert) renew() error {
	s.mu.RLock()
	ca := s.ca
	s.mu.RUnlock()
	c, err := ca.IssueServing(s.dnsNames, s.ttl, s.now())
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cert = c
	s.mu.Unlock()
	return nil
}

// SetAuthority re-issues the certificate from a (the CA rotated); on
// failure the current certificate is kept and a is still used for the
// next renewal.
func (s *ServingCert) SetAuthority(a *pki.Authority) error {
	s.mu.Lock()
	s.ca = a
	s.mu.Unlock()
	return s.renew()
}

// GetCertificate returns the current certificate.
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cert, nil
}

// RenewDue reports whether the certificate is past half its lifetime.
func (s *ServingCert) RenewDue() bool {
	s.mu.RLock()
	leaf := s.cert.Leaf
	s.mu.RUnlock()
	half := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	return !s.now().Before(half)
}

// Run renews the certificate when due, checking every interval, until ctx
// ends; a failed renewal keeps the current certificate and retries.
func (s *ServingCert) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !s.RenewDue() {
			continue
		}
		if err := s.renew(); err != nil {
			s.log.Warn("renew serving certificate failed; keeping the current one", "err", err)
		} else {
			s.log.Info("renewed serving certificate")
		}
	}
}
