// Package server is the CA's gRPC service,
// istio.v1.auth.IstioCertificateService/CreateCertificate
// (docs/wire-contract.md §6): it authenticates the caller's bearer token,
// decides the identity (its own or, for a trusted node proxy, the one it
// impersonates), checks the CSR and signs. Every request is counted by
// result.
package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// MetadataImpersonatedIdentity is the request metadata key a node proxy
// names the identity it asks for with.
const MetadataImpersonatedIdentity = "ImpersonatedIdentity"

// Authenticator turns a bearer token and cluster ID into a caller.
type Authenticator interface {
	Authenticate(ctx context.Context, token, clusterID string) (authn.Caller, error)
}

// Decider picks the identity to sign for a caller.
type Decider interface {
	Decide(ctx context.Context, caller authn.Caller, impersonated string) (workloadapi.Identity, error)
}

// Alarm hears of every request refused because the CA's own certificate
// cannot sign (expired, not yet valid, or ending within a certificate's
// minimum lifetime). It must not block.
type Alarm interface {
	CAUnusable(err error)
}

// Config configures a Server.
type Config struct {
	// TTL is the lifetime of the certificates; zero: pki.DefaultTTLRange.
	TTL pki.TTLRange
	// MaxRequestBytes refuses (and counts) larger requests; default 64 KiB.
	// Set the gRPC server's receive limit above it, so that such requests
	// reach the counter instead of failing in the transport.
	MaxRequestBytes int
	Now             func() time.Time
	// Registerer receives the request counter; nil registers nowhere.
	Registerer prometheus.Registerer
	// Alarm, when set, hears of refusals for the CA's own validity.
	Alarm Alarm
}

// Server implements securityapi.IstioCertificateServiceServer.
type Server struct {
	securityapi.UnimplementedIstioCertificateServiceServer
	cfg      Config
	authn    Authenticator
	decider  Decider
	ca       atomic.Pointer[pki.Authority]
	log      *slog.Logger
	requests *prometheus.CounterVec
}

// New returns a Server signing with ca.
func New(cfg Config, a Authenticator, d Decider, ca *pki.Authority, log *slog.Logger) (*Server, error) {
	if cfg.TTL == (pki.TTLRange{}) {
		cfg.TTL = pki.DefaultTTLRange
	}
	if err := cfg.TTL.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = 64 << 10
	}
	s := &Server{cfg: cfg, authn: a, decider: d, log: log.With("component", "ca"),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_ca_requests_total",
			Help: "Certificate requests by result: ok, or the reason they were refused.",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.requests); err != nil {
			return nil, err
		}
	}
	s.ca.Store(ca)
	return s, nil
}

// SetAuthority switches signing to a (a rotation step, the CA's Secret
// changed); requests in flight finish with the one they started with.
func (s *Server) SetAuthority(a *pki.Authority) { s.ca.Store(a) }

// Requests returns the request counter (for tests and debug views).
func (s *Server) Requests() *prometheus.CounterVec { return s.requests }

// CreateCertificate implements securityapi.IstioCertificateServiceServer.
func (s *Server) CreateCertificate(ctx context.Context, req *securityapi.IstioCertificateRequest) (*securityapi.IstioCertificateResponse, error) {
	chain, reason, err := s.create(ctx, req)
	s.requests.WithLabelValues(reason).Inc()
	if err != nil {
		s.log.Debug("certificate refused", "reason", reason, "err", err)
		return nil, err
	}
	return &securityapi.IstioCertificateResponse{CertChain: chain}, nil
}

func (s *Server) create(ctx context.Context, req *securityapi.IstioCertificateRequest) ([]string, string, error) {
	if n := proto.Size(req); n > s.cfg.MaxRequestBytes {
		return nil, "request_too_large", status.Errorf(codes.ResourceExhausted, "request of %d bytes, at most %d", n, s.cfg.MaxRequestBytes)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	token, ok := bearer(md.Get("authorization"))
	if !ok {
		return nil, "no_token", status.Error(codes.Unauthenticated, "missing bearer token in the authorization header")
	}
	caller, err := s.authn.Authenticate(ctx, token, first(md.Get("clusterid")))
	if errors.Is(err, authn.ErrThrottled) {
		return nil, "authn_throttled", status.Errorf(codes.ResourceExhausted, "authenticate: %v", err)
	}
	if err != nil {
		return nil, authnReason(err), status.Errorf(codes.Unauthenticated, "authenticate: %v", err)
	}
	impersonated := req.GetMetadata().GetFields()[MetadataImpersonatedIdentity].GetStringValue()
	id, err := s.decider.Decide(ctx, caller, impersonated)
	if err != nil {
		return nil, identityReason(err), status.Errorf(codes.Unauthenticated, "identity: %v", err)
	}
	csr, err := pki.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, csrReason(err), status.Errorf(codes.InvalidArgument, "csr: %v", err)
	}
	now := s.cfg.Now()
	// A CA that cannot cover a certificate's minimum lifetime signs
	// nothing: what it issued would be expired, or expire at once, and
	// every node proxy would fail on it.
	ca := s.ca.Load()
	if err := ca.Usable(now, s.cfg.TTL.Min); err != nil {
		if s.cfg.Alarm != nil {
			s.cfg.Alarm.CAUnusable(err)
		}
		return nil, caReason(err), status.Errorf(codes.Unavailable, "this CA cannot sign: %v", err)
	}
	chain, err := ca.Sign(csr, id, s.cfg.TTL.Clamp(req.GetValidityDuration()), now)
	if err != nil {
		return nil, "sign_failed", status.Errorf(codes.Internal, "sign: %v", err)
	}
	return chain, "ok", nil
}

func bearer(values []string) (string, bool) {
	for _, v := range values {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t, true
		}
	}
	return "", false
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func authnReason(err error) string {
	switch {
	case errors.Is(err, authn.ErrUnknownCluster):
		return "unknown_cluster"
	case errors.Is(err, authn.ErrNotWorkload):
		return "not_a_workload"
	case errors.Is(err, authn.ErrRejected):
		return "token_rejected"
	default:
		return "authn_error"
	}
}

func identityReason(err error) string {
	switch {
	case errors.Is(err, identity.ErrUntrustedImpersonator):
		return "impersonation_untrusted_account"
	case errors.Is(err, identity.ErrNoPodOnNode):
		return "impersonation_no_pod_on_node"
	case errors.Is(err, identity.ErrCallerPod), errors.Is(err, identity.ErrNotPodBound):
		return "impersonation_caller_pod"
	case errors.Is(err, identity.ErrMalformedIdentity), errors.Is(err, identity.ErrForeignTrustDomain):
		return "impersonation_bad_identity"
	default:
		return "identity_error"
	}
}

func caReason(err error) string {
	switch {
	case errors.Is(err, pki.ErrCAExpired):
		return "ca_expired"
	case errors.Is(err, pki.ErrCAExpiring):
		return "ca_expiring"
	case errors.Is(err, pki.ErrCANotYetValid):
		return "ca_not_yet_valid"
	default:
		return "ca_unusable"
	}
}

func csrReason(err error) string {
	switch {
	case errors.Is(err, pki.ErrCSRTooLarge):
		return "csr_too_large"
	case errors.Is(err, pki.ErrCSRSignature):
		return "csr_bad_signature"
	case errors.Is(err, pki.ErrCSRKeyRejected):
		return "csr_key_rejected"
	default:
		return "csr_malformed"
	}
}
