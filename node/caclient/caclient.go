// Package caclient asks the CA for workload certificates
// (docs/wire-contract.md §6): the unary
// istio.v1.auth.IstioCertificateService/CreateCertificate with the node
// proxy's token and, for the pods it serves, ImpersonatedIdentity.
package caclient

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Client signs CSRs through the CA.
type Client struct {
	Conn grpc.ClientConnInterface
	// Token returns the bearer token (audience istio-ca).
	Token     func(context.Context) (string, error)
	ClusterID string
	// Impersonate asks for the identity in the request (node proxy mode);
	// without it the CA signs the caller's own identity.
	Impersonate bool
}

// Sign implements identity.Signer.
func (c Client) Sign(ctx context.Context, csrPEM []byte, id workloadapi.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	var md []string
	if c.Token != nil {
		tok, err := c.Token(ctx)
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		md = append(md, "authorization", "Bearer "+tok)
	}
	if c.ClusterID != "" {
		md = append(md, "clusterid", c.ClusterID)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	req := &securityapi.IstioCertificateRequest{Csr: string(csrPEM), ValidityDuration: int64(ttl / time.Second)}
	if c.Impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": structpb.NewStringValue(id.String())}}
	}
	resp, err := securityapi.NewIstioCertificateServiceClient(c.Conn).CreateCertificate(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	return ParseChain(resp.GetCertChain())
}

// ParseChain parses the CA's answer: one PEM certificate per element
// (leaf first, root last); an element holding several is accepted too.
func ParseChain(pems []string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for _, p := range pems {
		rest := []byte(p)
		for {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if block.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("CA answer holds a %q block", block.Type)
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("CA answer: %w", err)
			}
			out = append(out, cert)
		}
		if strings.TrimSpace(string(rest)) != "" {
			return nil, errors.New("CA answer holds text that is not PEM")
		}
	}
	if len(out) == 0 {
		return nil, errors.New("CA answer holds no certificate")
	}
	return out, nil
}
