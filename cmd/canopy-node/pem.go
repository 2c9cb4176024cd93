package main

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// parsePEM parses the next CERTIFICATE block of b; none left returns no
// certificates.
func parsePEM(b []byte) ([]*x509.Certificate, []byte, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, nil, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("parse certificate: %w", err)
		}
		return []*x509.Certificate{c}, b, nil
	}
}
