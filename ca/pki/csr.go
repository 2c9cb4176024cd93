package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// MaxCSRSize bounds a PEM CSR; real ones are well under 2 KiB.
const MaxCSRSize = 16 << 10

// Reasons a CSR is refused. The gRPC layer maps each to a status code and
// counts it by name.
var (
	ErrCSRTooLarge    = errors.New("csr too large")
	ErrCSRMalformed   = errors.New("malformed csr")
	ErrCSRSignature   = errors.New("csr signature does not verify")
	ErrCSRKeyRejected = errors.New("csr key type or size not accepted")
)

// ParseCSR reads a PEM certificate request and checks it: one CERTIFICATE
// REQUEST block and nothing else, a valid self-signature (proof the caller
// holds the key), and an accepted key: ECDSA P-256 or P-384, RSA of 2048
// to 8192 bits, or Ed25519. Its subject and SANs are not looked at: the CA
// decides the identity.
func ParseCSR(b []byte) (*x509.CertificateRequest, error) {
	if len(b) > MaxCSRSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrCSRTooLarge, len(b), MaxCSRSize)
	}
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrCSRMalformed)
	}
	if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: PEM block %q, want CERTIFICATE REQUEST", ErrCSRMalformed, block.Type)
	}
	if len(trimSpace(rest)) > 0 {
		return nil, fmt.Errorf("%w: data after the PEM block", ErrCSRMalformed)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSRMalformed, err)
	}
	if err := checkKey(csr.PublicKey); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSRSignature, err)
	}
	return csr, nil
}

func checkKey(k any) error {
	switch k := k.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return nil
		}
		return fmt.Errorf("%w: ECDSA curve %s", ErrCSRKeyRejected, k.Curve.Params().Name)
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < 2048 || n > 8192 {
			return fmt.Errorf("%w: RSA key of %d bits, want 2048 to 8192", ErrCSRKeyRejected, n)
		}
		return nil
	case ed25519.PublicKey:
		return nil
	default:
		return fmt.Errorf("%w: %T", ErrCSRKeyRejected, k)
	}
}
