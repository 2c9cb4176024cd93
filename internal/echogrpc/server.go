// Package echogrpc is the gRPC mode of canopy-echo, the sample application
// of Canopy's local cluster: a proxyless gRPC server and client. With xDS
// on, the server takes its listener, mutual TLS and authorization from the
// mesh (grpc-go's xDS server, fed by the pod's agent through the bootstrap
// in GRPC_XDS_BOOTSTRAP), and the client resolves xds:/// targets the same
// way; without it both speak plaintext gRPC, for tests of the app itself.
package echogrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"github.com/canopy-mesh/canopy/internal/echogrpc/echopb"
)

// Limits of the server: a sample app, but one that runs in a mesh whose
// other listeners are bounded too.
const (
	maxStreams     = 100
	maxMessage     = 64 << 10
	connectTimeout = 10 * time.Second
	// maxEchoed bounds the message a reply carries back.
	maxEchoed = 1024
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Addr is the listen address (":7070").
	Addr string
	// Hostname and Version are reported in every reply.
	Hostname, Version string
	// XDS makes the server an xDS server: it serves only once the mesh
	// sent its listener, with the mesh's mutual TLS and authorization.
	XDS bool
}

// Server serves the Echo service.
type Server struct {
	echopb.UnimplementedEchoServiceServer
	cfg ServerConfig
	log *slog.Logger
	ln  net.Listener
	srv grpcServer
	// serving is the xDS serving mode; a plaintext server always serves.
	serving atomic.Bool
}

// grpcServer is what both grpc.Server and xds.GRPCServer offer.
type grpcServer interface {
	grpc.ServiceRegistrar
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

// NewServer binds the listener, so that a caller knows the address once it
// returns.
func NewServer(cfg ServerConfig, log *slog.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log}
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.ConnectionTimeout(connectTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute}),
	}
	if cfg.XDS {
		// Plaintext only where the mesh's listener says so (no
		// PeerAuthentication asks for mutual TLS): grpc-go's xDS
		// credentials never fall back on their own.
		creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
		if err != nil {
			return nil, fmt.Errorf("xds server credentials: %w", err)
		}
		opts = append(opts, grpc.Creds(creds), xds.ServingModeCallback(s.servingMode))
		x, err := xds.NewGRPCServer(opts...)
		if err != nil {
			return nil, fmt.Errorf("xds server (is GRPC_XDS_BOOTSTRAP set?): %w", err)
		}
		s.srv = x
	} else {
		s.srv = grpc.NewServer(opts...)
		s.serving.Store(true)
	}
	echopb.RegisterEchoServiceServer(s.srv, s)
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("listen grpc: %w", err)
	}
	s.ln = ln
	return s, nil
}

func (s *Server) servingMode(addr net.Addr, a xds.ServingModeChangeArgs) {
	s.serving.Store(a.Mode == connectivity.ServingModeServing)
	s.log.Info("xds serving mode", "addr", addr, "mode", a.Mode.String(), "err", a.Err)
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Ready is nil once the server serves: an xDS server from when the mesh
// sent its listener.
func (s *Server) Ready() error {
	if !s.serving.Load() {
		return errors.New("grpc: the mesh has not configured this server's listener yet")
	}
	return nil
}

// Run serves until ctx ends, then lets calls in flight finish.
func (s *Server) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stopped := make(chan struct{})
			go func() { s.srv.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				s.srv.Stop()
			}
		case <-done:
		}
	}()
	defer close(done)
	s.log.Info("serving grpc", "addr", s.Addr(), "xds", s.cfg.XDS)
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve grpc: %w", err)
	}
	return nil
}

// Echo answers who served the call and who made it.
func (s *Server) Echo(ctx context.Context, req *echopb.EchoRequest) (*echopb.EchoResponse, error) {
	msg := req.GetMessage()
	if len(msg) > maxEchoed {
		msg = msg[:maxEchoed]
	}
	resp := &echopb.EchoResponse{Message: msg, Hostname: s.cfg.Hostname, Version: s.cfg.Version}
	if p, ok := peer.FromContext(ctx); ok {
		resp.PeerPrincipal, resp.Secure = principal(p.AuthInfo)
	}
	return resp, nil
}

// principal is the URI SAN of the caller's certificate, and whether the
// call came over TLS at all.
func principal(info credentials.AuthInfo) (string, bool) {
	var state tls.ConnectionState
	switch i := info.(type) {
	case credentials.TLSInfo:
		state = i.State
	case *credentials.TLSInfo:
		state = i.State
	default:
		return "", false
	}
	if len(state.PeerCertificates) == 0 || len(state.PeerCertificates[0].URIs) == 0 {
		return "", true
	}
	return state.PeerCertificates[0].URIs[0].String(), true
}

// Hostname is the pod's name, as the server reports it.
func Hostname() string {
	h, _ := os.Hostname()
	return h
}
