package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// peerIdentity verifies a peer's chain against roots (no hostnames:
// identities are SPIFFE URIs) and returns its identity.
func peerIdentity(rawCerts [][]byte, roots *x509.CertPool) (workloadapi.Identity, error) {
	if len(rawCerts) == 0 {
		return workloadapi.Identity{}, errors.New("no certificate")
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return workloadapi.Identity{}, err
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return workloadapi.Identity{}, fmt.Errorf("verify peer chain: %w", err)
	}
	return leafIdentity(certs[0])
}

// leafIdentity is the SPIFFE ID of a certificate already verified.
func leafIdentity(c *x509.Certificate) (workloadapi.Identity, error) {
	if len(c.URIs) != 1 {
		return workloadapi.Identity{}, fmt.Errorf("peer certificate has %d URI SANs, want one SPIFFE ID", len(c.URIs))
	}
	return workloadapi.ParseIdentity(c.URIs[0].String())
}

// clientTLS presents src's certificate and accepts only a server whose
// identity is one of want (wire contract §5.2: no SNI, no hostname check).
func clientTLS(cert *tls.Certificate, roots *x509.CertPool, want []workloadapi.Identity) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
		InsecureSkipVerify: true, // replaced by the SPIFFE check below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := peerIdentity(raw, roots)
			if err != nil {
				return err
			}
			for _, w := range want {
				if id == w {
					return nil
				}
			}
			return fmt.Errorf("server identity %s is not the destination's %v", id, want)
		},
	}
}

// serverTLS presents the pod's certificate and requires a client of the
// same trust domain; the verified identity is read from the state after
// the handshake.
func serverTLS(cert *tls.Certificate, roots *x509.CertPool, trustDomain string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
		ClientAuth: tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := peerIdentity(raw, roots)
			if err != nil {
				return err
			}
			if id.TrustDomain != trustDomain {
				return fmt.Errorf("client trust domain %q, want %q", id.TrustDomain, trustDomain)
			}
			return nil
		},
	}
}
