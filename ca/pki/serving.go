package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// IssueServing issues a TLS serving certificate for the CA's own server
// (the controller's 15012): a new ECDSA P-256 key and a leaf for dnsNames,
// valid from now for ttl (never past the CA), with the chain up to the
// root so that clients trusting the bundle verify it.
func (a *Authority) IssueServing(dnsNames []string, ttl time.Duration, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl, err := a.leafTemplate(ttl, now)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.DNSNames = dnsNames
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.Key)
	if err != nil {
		return nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	for _, ca := range a.Chain {
		c.Certificate = append(c.Certificate, ca.Raw)
	}
	return c, nil
}
