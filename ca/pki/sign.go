package pki

import (
	"crypto/rand"
	"crypto/x509"
	"errors"
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

// Reasons the CA cannot sign at a given time.
var (
	ErrCANotYetValid = errors.New("CA certificate not yet valid")
	ErrCAExpired     = errors.New("CA certificate expired")
	// ErrCAExpiring: the CA is valid, but for less than a certificate's
	// minimum lifetime; what it issued would be useless.
	ErrCAExpiring = errors.New("CA certificate expires within a workload certificate's minimum lifetime")
)

// Validity is when the CA may sign: from the latest NotBefore to the
// earliest NotAfter of its certificate, the chain above it and the root
// that chain ends at. Leaves never outlive it.
func (a *Authority) Validity() (notBefore, notAfter time.Time) {
	certs := append([]*x509.Certificate{a.Cert}, a.Chain...)
	if last := certs[len(certs)-1]; !isSelfSigned(last) {
		for _, r := range a.Roots {
			if last.CheckSignatureFrom(r) == nil {
				certs = append(certs, r)
				break
			}
		}
	}
	notBefore, notAfter = certs[0].NotBefore, certs[0].NotAfter
	for _, c := range certs[1:] {
		if c.NotBefore.After(notBefore) {
			notBefore = c.NotBefore
		}
		if c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	return notBefore, notAfter
}

// Usable reports whether the CA may sign at now a certificate that lives
// at least minLeaf: nil, or ErrCANotYetValid, ErrCAExpired or
// ErrCAExpiring wrapped with the dates.
func (a *Authority) Usable(now time.Time, minLeaf time.Duration) error {
	notBefore, notAfter := a.Validity()
	switch {
	case now.Before(notBefore):
		return fmt.Errorf("%w: valid from %s", ErrCANotYetValid, notBefore.UTC().Format(time.RFC3339))
	case !now.Before(notAfter):
		return fmt.Errorf("%w at %s", ErrCAExpired, notAfter.UTC().Format(time.RFC3339))
	case notAfter.Sub(now) < minLeaf:
		return fmt.Errorf("%w (%s): it expires at %s", ErrCAExpiring, minLeaf, notAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// leafTemplate starts a leaf certificate: a random serial, valid from a
// minute ago (clock skew between nodes) for ttl, but never past the CA.
// A CA outside its validity signs nothing.
func (a *Authority) leafTemplate(ttl time.Duration, now time.Time) (*x509.Certificate, error) {
	if err := a.Usable(now, 0); err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(ttl)
	if _, caNotAfter := a.Validity(); notAfter.After(caNotAfter) {
		notAfter = caNotAfter
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
