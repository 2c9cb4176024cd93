package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Defaults of the CA (docs/wire-contract.md §6.4).
const (
	// RootTTL is the lifetime of a self-signed root: ten years.
	RootTTL = 3650 * 24 * time.Hour
	// DefaultTTL, MinTTL and MaxTTL are the default lifetime of workload
	// certificates and its bounds. Istio's default is 24 hours too, and its
	// MAX_WORKLOAD_CERT_TTL 90 days with no lower bound; Canopy's node
	// proxy asks for 24 hours and renews at half of that, so a longer
	// certificate only outlives a revoked identity.
	DefaultTTL = 24 * time.Hour
	MinTTL     = 10 * time.Minute
	MaxTTL     = 24 * time.Hour
	// rootKeyBits is the self-signed root's RSA key size.
	rootKeyBits = 2048
)

// Authority signs workload certificates with its key. Chain holds the
// certificates from the signing certificate up to the root (for a
// self-signed root, just the root); Roots is the trust bundle it
// distributes, which may hold several roots during a rotation.
type Authority struct {
	Cert  *x509.Certificate
	Key   crypto.Signer
	Chain []*x509.Certificate
	Roots []*x509.Certificate
}

// NewSelfSigned generates a self-signed root for a trust domain, valid
// from now for ttl (RootTTL when zero).
func NewSelfSigned(trustDomain string, ttl time.Duration, now time.Time) (*Authority, error) {
	if ttl == 0 {
		ttl = RootTTL
	}
	key, err := rsa.GenerateKey(rand.Reader, rootKeyBits)
	if err != nil {
		return nil, fmt.Errorf("generate root key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{trustDomain}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create root certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Authority{Cert: cert, Key: key, Chain: []*x509.Certificate{cert}, Roots: []*x509.Certificate{cert}}, nil
}

// Load builds an Authority from PEM: the signing certificate and its key,
// the chain above it (empty for a self-signed root) and the trust bundle
// (one or more roots). It checks that the key matches the certificate,
// that the certificate may sign, and that the chain reaches a root of the
// bundle.
func Load(certPEM, keyPEM, chainPEM, rootsPEM []byte, now time.Time) (*Authority, error) {
	certs, err := ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("CA certificate: want one certificate, got %d", len(certs))
	}
	cert := certs[0]
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate may not sign certificates")
	}
	chain, err := ParseCertificates(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("CA chain: %w", err)
	}
	roots, err := ParseCertificates(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("root bundle: %w", err)
	}
	if len(roots) == 0 {
		return nil, errors.New("root bundle: no certificate")
	}
	a := &Authority{Cert: cert, Key: key, Chain: append([]*x509.Certificate{cert}, chain...), Roots: roots}
	if err := a.verifyChain(now); err != nil {
		return nil, err
	}
	return a, nil
}

// verifyChain checks that the signing certificate chains to a root of the
// bundle through the given chain.
func (a *Authority) verifyChain(now time.Time) error {
	roots := x509.NewCertPool()
	for _, r := range a.Roots {
		roots.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range a.Chain[1:] {
		inter.AddCert(c)
	}
	_, err := a.Cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return fmt.Errorf("CA certificate does not chain to the root bundle: %w", err)
	}
	return nil
}

// ParseCertificates reads every CERTIFICATE block of a PEM bundle; other
// block types and trailing text are errors.
func ParseCertificates(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(trimSpace(b)) > 0 {
		return nil, errors.New("trailing data after the PEM certificates")
	}
	return out, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

func parseKey(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var k any
	var err error
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported key block %q", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// EncodeCertificates returns the certificates as a PEM bundle.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// EncodeKey returns the key as PKCS#8 PEM.
func EncodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	return s, nil
}
