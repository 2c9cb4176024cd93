package pki

import (
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net/url"
	"time"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TTLRange is the lifetime of workload certificates: Default when a
// request names none, requests clamped into [Min, Max].
type TTLRange struct {
	Default, Min, Max time.Duration
}

// DefaultTTLRange is DefaultTTL within [MinTTL, MaxTTL].
var DefaultTTLRange = TTLRange{Default: DefaultTTL, Min: MinTTL, Max: MaxTTL}

// Validate checks 0 < Min <= Default <= Max.
func (r TTLRange) Validate() error {
	if r.Min <= 0 || r.Min > r.Default || r.Default > r.Max {
		return fmt.Errorf("certificate lifetimes: want 0 < minimum (%s) <= default (%s) <= maximum (%s)", r.Min, r.Default, r.Max)
	}
	return nil
}

// Clamp turns a requested validity in seconds into a lifetime: the default
// for zero or less, else the request clamped into [Min, Max]
// (docs/wire-contract.md §6.1).
func (r TTLRange) Clamp(requestedSeconds int64) time.Duration {
	switch {
	case requestedSeconds <= 0:
		return r.Default
	case requestedSeconds > int64(r.Max/time.Second):
		return r.Max
	case time.Duration(requestedSeconds)*time.Second < r.Min:
		return r.Min
	}
	return time.Duration(requestedSeconds) * time.Second
}

// Sign issues a workload certificate for the CSR's key with id as its only
// identity (a URI SAN; the CSR's own names are ignored), valid from now for
// ttl but never past the CA's own certificate. It returns the chain as PEM
// strings, leaf first and root last, each ending in a newline
// (docs/wire-contract.md §6.1).
func (a *Authority) Sign(csr *x509.CertificateRequest, id workloadapi.Identity, ttl time.Duration, now time.Time) ([]string, error) {
	uri, err := url.Parse(id.String())
	if err != nil {
		return nil, fmt.Errorf("identity %s: %w", id, err)
	}
	tmpl, err := a.leafTemplate(ttl, now)
	if err != nil {
		return nil, err
	}
	// An empty subject makes the SAN extension critical, as RFC 5280 asks:
	// the URI is the certificate's only name.
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.URIs = []*url.URL{uri}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, csr.PublicKey, a.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	chain := []string{string(EncodeCertificates(leaf))}
	for _, c := range a.Chain {
		chain = append(chain, string(EncodeCertificates(c)))
	}
	// The chain ends with the root: a plug-in CA's chain may stop at its
	// intermediates, so add the root it chains to when missing.
	if last := a.Chain[len(a.Chain)-1]; !isSelfSigned(last) {
		for _, r := range a.Roots {
			if last.CheckSignatureFrom(r) == nil {
				chain = append(chain, string(EncodeCertificates(r)))
				break
			}
		}
	}
	return chain, nil
}

// leafTemplate starts a leaf certificate: a random serial, valid from a
// minute ago (clock skew between nodes) for ttl, but never past the CA.
func (a *Authority) leafTemplate(ttl time.Duration, now time.Time) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(ttl)
	if notAfter.After(a.Cert.NotAfter) {
		notAfter = a.Cert.NotAfter
	}
	return &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              notAfter,
		BasicConstraintsValid: true,
	}, nil
}

func isSelfSigned(c *x509.Certificate) bool {
	return c.CheckSignatureFrom(c) == nil
}
