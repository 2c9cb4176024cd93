package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	securityapi "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/expiry"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/reload"
	"github.com/canopy-mesh/canopy/ca/rootstore"
	"github.com/canopy-mesh/canopy/ca/server"
)

// grpcRecvLimit is the transport's bound on a request. An xDS reconnect
// lists every resource the proxy holds (about 60 bytes each); the CA
// service refuses (and counts) requests over its own limit (64 KiB).
const grpcRecvLimit = 16 << 20

// grpcOptions are the options of both gRPC ports.
func grpcOptions(cfg config) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(grpcRecvLimit), grpc.MaxConcurrentStreams(cfg.grpcMaxStreams),
		// Istio's agents and proxyless clients ping every 30 s, also between
		// streams; gRPC's default (5 min) would end their connections as
		// too_many_pings.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
		// Connections are renewed every 30 minutes (streams in flight
		// finish), so proxies spread over replicas as they come and go.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 30 * time.Minute}),
	}
	if cfg.xds.SendBudget != nil {
		// The budget learns from its codec when gRPC has written a
		// response; every other message is encoded as by gRPC's own.
		opts = append(opts, grpc.ForceServerCodecV2(cfg.xds.SendBudget.Codec()))
	}
	return opts
}

// caParts is the CA as the controller runs it: the gRPC service on the
// secure port with a certificate of its own. (The root ConfigMaps are
// published by the writers, on the leader.)
type caParts struct {
	addr string
	// grpc is the secure port's server; workload xDS registers on it too.
	grpc          *grpc.Server
	authenticator *authn.Authenticator
	serving       *server.ServingCert
	expiry        *expiry.Monitor
	reload        *reload.Watcher
	// rootBundle is the PEM roots at start; publish follows them.
	rootBundle []byte
	log        *slog.Logger
}

// newCA loads the CA's key material and builds its service; pods is its
// view of the cluster's pods for the impersonation checks. Events about
// the CA's expiry go to events while leading says so (nil: always).
// publish is given the PEM roots whenever they change, before anything
// else hears of it.
func newCA(ctx context.Context, cfg config, kube kubernetes.Interface, reviewer authn.TokenReviewer, pods identity.Pods, events expiry.Recorder,
	leading func() bool, publish func(bundle []byte), reg prometheus.Registerer, log *slog.Logger) (*caParts, error) {
	authority, fromDir, err := rootstore.LoadDir(cfg.caCertsDir, time.Now())
	source := rootstore.SourcePlugInDir
	if err != nil {
		return nil, err
	}
	if !fromDir {
		if authority, source, err = rootstore.Load(ctx, kube, cfg.caNamespace, cfg.mesh.TrustDomain, time.Now()); err != nil {
			return nil, fmt.Errorf("load CA: %w", err)
		}
	}
	// Later reads come from the same place: a rotation edits the material
	// where it is, it does not move it.
	load := func(ctx context.Context, now time.Time) (*pki.Authority, error) {
		if fromDir {
			a, ok, err := rootstore.LoadDir(cfg.caCertsDir, now)
			if err == nil && !ok {
				err = fmt.Errorf("%s holds no %s any more", cfg.caCertsDir, rootstore.KeyCACert)
			}
			return a, err
		}
		a, src, err := rootstore.Load(ctx, kube, cfg.caNamespace, "", now)
		if err == nil && src != source {
			err = fmt.Errorf("the CA moved from %s to %s: restart the controller to switch", source, src)
		}
		return a, err
	}
	_, notAfter := authority.Validity()
	log.Info("CA loaded", "source", string(source), "namespace", cfg.caNamespace, "not_after", notAfter)
	monitor, err := expiry.New(expiry.Config{
		Secret:     &corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: cfg.caNamespace, Name: source.Secret()},
		MinLeafTTL: cfg.certTTL.Min, WarnBefore: cfg.caExpiryWarning, Registerer: reg, EventsWhen: leading,
	}, authority, events, log)
	if err != nil {
		return nil, err
	}
	ac := cfg.authn
	ac.LocalCluster = cfg.mesh.ClusterID
	ac.Clusters = map[string]authn.TokenReviewer{cfg.mesh.ClusterID: reviewer}
	ac.Audiences = cfg.tokenAudiences
	authenticator, err := authn.New(ac)
	if err != nil {
		return nil, err
	}
	decider := identity.Decider{TrustDomain: cfg.mesh.TrustDomain, TrustedNodeAccounts: cfg.trustedNodeAccounts, Pods: pods}
	svc, err := server.New(server.Config{TTL: cfg.certTTL, Registerer: reg, Alarm: monitor}, authenticator, decider, authority, log)
	if err != nil {
		return nil, err
	}
	serving, err := server.NewServingCert(authority, cfg.caDNSNames, 24*time.Hour, time.Now, log)
	if err != nil {
		return nil, err
	}
	creds := credentials.NewTLS(&tls.Config{GetCertificate: serving.GetCertificate, MinVersion: tls.VersionTLS12})
	g := grpc.NewServer(append(grpcOptions(cfg), grpc.Creds(creds))...)
	securityapi.RegisterIstioCertificateServiceServer(g, svc)
	watcher := reload.New(authority, load, cfg.caReload, log)
	// The bundle first: proxies must trust a new root before anything
	// they are shown is signed under it.
	watcher.OnChange(func(a *pki.Authority) { publish(pki.EncodeCertificates(a.Roots...)) })
	watcher.OnChange(func(a *pki.Authority) {
		if err := serving.SetAuthority(a); err != nil {
			log.Error("serving certificate from the new CA failed; keeping the current one", "err", err)
		}
	})
	watcher.OnChange(monitor.SetAuthority)
	watcher.OnChange(svc.SetAuthority)
	return &caParts{addr: cfg.secureAddr, grpc: g, authenticator: authenticator, serving: serving, expiry: monitor,
		reload: watcher, rootBundle: pki.EncodeCertificates(authority.Roots...), log: log}, nil
}

func (c *caParts) start(ctx context.Context, g *errgroup.Group) {
	g.Go(func() error { return c.expiry.Run(ctx) })
	g.Go(func() error { return c.reload.Run(ctx) })
	g.Go(func() error { c.serving.Run(ctx, time.Minute); return nil })
	serveGRPC(ctx, g, c.grpc, c.addr, "CA and xDS over TLS", c.log)
}

// serveGRPC serves s on addr until ctx ends. Streams are long-lived, so
// the stop is not graceful: proxies reconnect to another replica.
func serveGRPC(ctx context.Context, g *errgroup.Group, s *grpc.Server, addr, what string, log *slog.Logger) {
	g.Go(func() error {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: listen: %w", what, err)
		}
		log.Info("serving "+what, "addr", addr)
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		s.Stop()
		return nil
	})
}
