// Command canopy-node is Canopy's node proxy (a DaemonSet): it learns the
// mesh over workload xDS, gets one certificate per local identity from the
// CA, receives each ambient pod's network namespace from the CNI agent
// over ZDS, and carries the pods' traffic through HBONE with mutual TLS,
// enforcing L4 authorization.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/internal/cmdmain"
	"github.com/canopy-mesh/canopy/internal/httpserve"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/version"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/node/admin"
	"github.com/canopy-mesh/canopy/node/caclient"
	"github.com/canopy-mesh/canopy/node/configdump"
	"github.com/canopy-mesh/canopy/node/dns"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/node/pods"
	"github.com/canopy-mesh/canopy/node/proxy"
	"github.com/canopy-mesh/canopy/node/trustbundle"
	"github.com/canopy-mesh/canopy/node/zdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

type config struct {
	xdsAddr, caAddr, serverName string
	clusterID, trustDomain      string
	tokenPath, rootCertPath     string
	zdsSocket                   string
	nodeName, podName, podNS    string
	instanceIP                  netip.Addr
	onDemand                    bool
	lookupTimeout               time.Duration
	// dnsProxy serves DNS in every pod (15053); clusterDomain names its
	// Kubernetes names, resolvConf the stand-in resolvers.
	dnsProxy                  bool
	clusterDomain, resolvConf string
	dnsLimits                 dns.Limits
	// bpfRoot is where the CNI agent pins the socket maps of pods it
	// redirects with eBPF; empty: none is looked for.
	bpfRoot                string
	limits                 proxy.Limits
	rootReload             time.Duration
	adminAddr, metricsAddr string
	readyAddr              string
	certTTL, drain         time.Duration
	logLevel               slog.Level
	roots                  []*x509.Certificate
}

func env(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("canopy-node", flag.ContinueOnError)
	fs.StringVar(&c.xdsAddr, "xds-address", or(env("XDS_ADDRESS"), "canopy-controller.istio-system.svc:15012"), "workload xDS server host:port (TLS) ($XDS_ADDRESS)")
	fs.StringVar(&c.caAddr, "ca-address", env("CA_ADDRESS"), "CA host:port (default: the xDS address) ($CA_ADDRESS)")
	fs.StringVar(&c.serverName, "xds-server-name", env("ALT_XDS_HOSTNAME"), "name the control plane's certificate must carry (default: the address's host)")
	fs.StringVar(&c.clusterID, "cluster-id", or(env("ISTIO_META_CLUSTER_ID", "CLUSTER_ID"), "Kubernetes"), "cluster ID ($CLUSTER_ID)")
	fs.StringVar(&c.trustDomain, "trust-domain", or(env("TRUST_DOMAIN"), "cluster.local"), "trust domain")
	fs.StringVar(&c.tokenPath, "token", "./var/run/secrets/tokens/istio-token", "projected service-account token (audience istio-ca)")
	fs.StringVar(&c.rootCertPath, "root-cert", or(env("XDS_ROOT_CA"), "./var/run/secrets/istio/root-cert.pem"), "trusted roots (PEM), re-read while running")
	fs.DurationVar(&c.rootReload, "root-cert-reload", 10*time.Second, "how often --root-cert is checked for changes")
	fs.StringVar(&c.zdsSocket, "zds-socket", or(env("INPOD_UDS"), "/var/run/ztunnel/ztunnel.sock"), "the CNI agent's ZDS socket ($INPOD_UDS)")
	fs.StringVar(&c.nodeName, "node-name", env("NODE_NAME"), "this node ($NODE_NAME)")
	fs.StringVar(&c.podName, "pod-name", env("POD_NAME"), "this proxy's pod ($POD_NAME)")
	fs.StringVar(&c.podNS, "pod-namespace", env("POD_NAMESPACE"), "this proxy's namespace ($POD_NAMESPACE)")
	ip := fs.String("instance-ip", env("INSTANCE_IP"), "this proxy's pod IP ($INSTANCE_IP)")
	fs.BoolVar(&c.onDemand, "on-demand", env("XDS_ON_DEMAND") == "true", "subscribe to addresses on demand ($XDS_ON_DEMAND)")
	fs.DurationVar(&c.lookupTimeout, "on-demand-timeout", proxy.DefaultLookupTimeout, "with --on-demand, how long a connection waits for its destination to be looked up before it is refused")
	// On unless the proxy metadata says otherwise, as Istio's node proxy.
	fs.BoolVar(&c.dnsProxy, "dns-proxy", !strings.EqualFold(env("ISTIO_META_DNS_CAPTURE", "DNS_CAPTURE"), "false"), "serve DNS in every pod on 15053: mesh names answered, the rest relayed to the pod's resolvers ($ISTIO_META_DNS_CAPTURE); not with --on-demand")
	fs.StringVar(&c.clusterDomain, "cluster-domain", or(env("CLUSTER_DOMAIN"), "cluster.local"), "the Kubernetes cluster domain, for the DNS proxy's names ($CLUSTER_DOMAIN)")
	fs.StringVar(&c.resolvConf, "dns-fallback-resolv-conf", "/etc/resolv.conf", "resolvers for a pod whose own resolv.conf cannot be read (no process of it in sight)")
	c.dnsLimits = dns.DefaultLimits()
	fs.IntVar(&c.dnsLimits.MaxInFlight, "dns-max-in-flight", c.dnsLimits.MaxInFlight, "DNS queries of one pod handled at once; past it UDP queries are dropped")
	fs.IntVar(&c.dnsLimits.MaxTCPConns, "dns-max-tcp-connections", c.dnsLimits.MaxTCPConns, "DNS TCP connections one pod may hold open")
	fs.StringVar(&c.bpfRoot, "bpf-root", sockmap.DefaultRoot, "where the CNI agent pins the socket maps of the pods it redirects with eBPF (a BPF filesystem mounted from the node); the proxy puts its listeners in a pod's map when there is one; empty: every pod is taken as redirected by netfilter")
	def := proxy.DefaultLimits()
	c.limits = def // fields without a flag keep their defaults
	fs.IntVar(&c.limits.MaxConnections, "max-connections", def.MaxConnections, "accepted connections held open at once, node-wide; more are closed at once")
	fs.IntVar(&c.limits.MaxConnectionsPerPod, "max-connections-per-pod", def.MaxConnectionsPerPod, "accepted connections held open at once for one pod")
	fs.DurationVar(&c.limits.HandshakeTimeout, "handshake-timeout", def.HandshakeTimeout, "limit on an inbound mTLS handshake on 15008")
	fs.IntVar(&c.limits.MaxPendingHandshakes, "max-pending-handshakes", def.MaxPendingHandshakes, "inbound connections on 15008 whose peer is not authenticated yet, node-wide; past it a new one closes the oldest")
	fs.IntVar(&c.limits.MaxPendingHandshakesPerSource, "max-pending-handshakes-per-source", def.MaxPendingHandshakesPerSource, "inbound connections on 15008 whose peer is not authenticated yet, from one source address; more are closed at once")
	fs.DurationVar(&c.limits.DialTimeout, "dial-timeout", def.DialTimeout, "limit on an outbound connection's set-up (TCP, and mTLS for HBONE)")
	fs.DurationVar(&c.limits.ConnectTimeout, "connect-timeout", def.ConnectTimeout, "limit on the wait for an HBONE CONNECT's answer")
	fs.IntVar(&c.limits.HBONE.MaxStreams, "hbone-max-streams", def.HBONE.MaxStreams, "streams (and running handlers) one HBONE connection's peer may have at once")
	fs.DurationVar(&c.limits.HBONE.IdleTimeout, "hbone-idle-timeout", def.HBONE.IdleTimeout, "an HBONE connection without a stream this long is closed (GOAWAY)")
	fs.DurationVar(&c.limits.HBONE.WriteTimeout, "hbone-write-timeout", def.HBONE.WriteTimeout, "an HBONE connection whose writes make no progress this long (a peer that stopped reading) is closed")
	fs.DurationVar(&c.limits.HBONE.HandshakeTimeout, "hbone-handshake-timeout", def.HBONE.HandshakeTimeout, "limit on the HTTP/2 preface and first SETTINGS of an HBONE connection")
	fs.StringVar(&c.adminAddr, "admin-addr", "127.0.0.1:15000", "admin port (config_dump, quitquitquit, pprof)")
	fs.StringVar(&c.metricsAddr, "metrics-addr", ":15020", "Prometheus port")
	fs.StringVar(&c.readyAddr, "readiness-addr", ":15021", "readiness port (/healthz/ready)")
	fs.DurationVar(&c.certTTL, "cert-ttl", 24*time.Hour, "workload certificate lifetime asked for ($SECRET_TTL)")
	fs.DurationVar(&c.drain, "drain-period", 5*time.Second, "how long connections may finish after SIGTERM")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("--log-level: %w", err)
	}
	if c.caAddr == "" {
		c.caAddr = c.xdsAddr
	}
	for _, a := range []struct{ flag, v string }{{"--xds-address", c.xdsAddr}, {"--ca-address", c.caAddr}, {"--admin-addr", c.adminAddr}, {"--metrics-addr", c.metricsAddr}, {"--readiness-addr", c.readyAddr}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return c, fmt.Errorf("%s %q: %w", a.flag, a.v, err)
		}
	}
	if c.serverName == "" {
		c.serverName, _, _ = net.SplitHostPort(c.xdsAddr)
	}
	for _, r := range []struct{ flag, v string }{{"--node-name", c.nodeName}, {"--pod-name", c.podName}, {"--pod-namespace", c.podNS}} {
		if r.v == "" {
			return c, fmt.Errorf("%s is required", r.flag)
		}
	}
	var err error
	if c.instanceIP, err = netip.ParseAddr(*ip); err != nil {
		return c, fmt.Errorf("--instance-ip %q: %w", *ip, err)
	}
	if c.certTTL < time.Minute || c.drain < 0 {
		return c, errors.New("--cert-ttl must be at least a minute and --drain-period not negative")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--on-demand-timeout", c.lookupTimeout}, {"--root-cert-reload", c.rootReload}, {"--handshake-timeout", c.limits.HandshakeTimeout}, {"--dial-timeout", c.limits.DialTimeout}, {"--connect-timeout", c.limits.ConnectTimeout},
		{"--hbone-idle-timeout", c.limits.HBONE.IdleTimeout}, {"--hbone-write-timeout", c.limits.HBONE.WriteTimeout}, {"--hbone-handshake-timeout", c.limits.HBONE.HandshakeTimeout}} {
		if d.v <= 0 {
			return c, fmt.Errorf("%s must be positive, got %s", d.flag, d.v)
		}
	}
	if c.dnsLimits.MaxInFlight <= 0 || c.dnsLimits.MaxTCPConns <= 0 {
		return c, errors.New("--dns-max-in-flight and --dns-max-tcp-connections must be positive")
	}
	if c.onDemand && c.dnsProxy {
		// Answers come from the whole table; an on-demand table holds
		// only what connections asked for, so most mesh names would go
		// to the cluster resolver, which does not know ServiceEntry
		// hosts. Istio's node proxy refuses the pair too.
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "dns-proxy" })
		if explicit {
			return c, errors.New("--dns-proxy needs the whole table: not with --on-demand")
		}
		c.dnsProxy = false
	}
	if c.bpfRoot != "" && !filepath.IsAbs(c.bpfRoot) {
		return c, fmt.Errorf("--bpf-root %q must be an absolute path (or empty)", c.bpfRoot)
	}
	if c.limits.MaxConnections <= 0 || c.limits.MaxConnectionsPerPod <= 0 || c.limits.HBONE.MaxStreams <= 0 {
		return c, errors.New("--max-connections, --max-connections-per-pod and --hbone-max-streams must be positive")
	}
	if c.limits.MaxPendingHandshakes <= 0 || c.limits.MaxPendingHandshakesPerSource <= 0 {
		return c, errors.New("--max-pending-handshakes and --max-pending-handshakes-per-source must be positive")
	}
	pemBytes, err := os.ReadFile(c.rootCertPath)
	if err != nil {
		return c, fmt.Errorf("--root-cert: %w", err)
	}
	if c.roots, err = trustbundle.Parse(pemBytes); err != nil {
		return c, fmt.Errorf("--root-cert %s: %w", c.rootCertPath, err)
	}
	if _, err := os.Stat(c.tokenPath); err != nil {
		return c, fmt.Errorf("--token: %w", err)
	}
	return c, nil
}

func main() {
	cmdmain.Run("canopy-node", parseFlags, func(c config) slog.Level { return c.logLevel }, run)
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	// The root bundle is re-read while the proxy runs: a rotated root is
	// trusted, and a removed one dropped, without a restart, both for the
	// control plane's certificate and for peers'.
	var certs *identity.Manager
	bundle, err := trustbundle.Load(cfg.rootCertPath, func(roots []*x509.Certificate) {
		if certs != nil {
			certs.SetRoots(roots)
		}
	}, log)
	if err != nil {
		return err
	}
	creds := credentials.NewTLS(&tls.Config{ServerName: cfg.serverName, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify:    true, // replaced by VerifyPeerCertificate, which reads the current bundle
		VerifyPeerCertificate: bundle.VerifyServer(cfg.serverName)})
	xdsConn, err := grpc.NewClient(cfg.xdsAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer xdsConn.Close()
	caConn := xdsConn
	if cfg.caAddr != cfg.xdsAddr {
		if caConn, err = grpc.NewClient(cfg.caAddr, grpc.WithTransportCredentials(creds)); err != nil {
			return err
		}
		defer caConn.Close()
	}
	token := func(context.Context) (string, error) {
		b, err := os.ReadFile(cfg.tokenPath)
		return strings.TrimSpace(string(b)), err
	}
	md, err := structpb.NewStruct(map[string]any{
		"NAME": cfg.podName, "NAMESPACE": cfg.podNS, "INSTANCE_IPS": cfg.instanceIP.String(), "NODE_NAME": cfg.nodeName,
		"CLUSTER_ID": cfg.clusterID, "ISTIO_VERSION": version.Get(),
	})
	if err != nil {
		return err
	}
	node := &corev3.Node{Id: fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local", cfg.instanceIP, cfg.podName, cfg.podNS, cfg.podNS), Metadata: md}
	registry := prometheus.NewRegistry()
	table := workloadtable.New()
	xc, err := xdsclient.New(xdsclient.Config{Conn: xdsConn, Node: node, Token: token, ClusterID: cfg.clusterID, OnDemand: cfg.onDemand, Handler: table, Log: log})
	if err != nil {
		return err
	}
	certs, err = identity.New(identity.Config{TTL: cfg.certTTL, Roots: bundle.Roots(), Registerer: registry},
		caclient.Client{Conn: caConn, Token: token, ClusterID: cfg.clusterID, Impersonate: true}, log)
	if err != nil {
		return err
	}
	px, err := proxy.New(table, certs, cfg.clusterID, registry, log)
	if err != nil {
		return err
	}
	px.Limits = cfg.limits
	if cfg.onDemand {
		px.OnDemand, px.LookupTimeout = xc, cfg.lookupTimeout
	}
	defer px.Close()
	set := &pods.Set{Node: cfg.nodeName, Workloads: table, Certs: certs, Server: px, Log: log, ClusterID: cfg.clusterID, TrustDomain: cfg.trustDomain,
		Sockets: inpod.Options{BPFRoot: cfg.bpfRoot}}
	if cfg.bpfRoot != "" {
		// Not an error: an agent that redirects with netfilter pins
		// nothing, and each pod's map is looked for when it is served.
		// But a pod the agent redirects with eBPF while the proxy cannot
		// see its pins (no BPF filesystem mounted from the node) is
		// served by listeners its traffic never reaches: say where the
		// proxy looks.
		if _, err := os.Stat(cfg.bpfRoot); err != nil {
			log.Info("BPF root not there (yet): pods are taken as redirected by netfilter until their socket map is", "bpf_root", cfg.bpfRoot, "err", err)
		}
	}
	var dnsView func(string, []*workloadapi.Service) (configdump.DNSView, bool)
	if cfg.dnsProxy {
		resolvers := dns.Resolvers{Fallback: cfg.resolvConf, MaxInFlight: cfg.dnsLimits.MaxInFlight, Log: log}
		ds, err := dns.New(dns.Config{Table: table, Upstreams: resolvers.Upstreams(), ClusterDomain: cfg.clusterDomain, Limits: cfg.dnsLimits, Registerer: registry, Log: log})
		if err != nil {
			return err
		}
		set.Server = pods.Servers{px, ds}
		set.Sockets.DNS = true
		dnsView = ds.View
	}
	defer set.Close()
	// stopping ends on SIGTERM (or SIGINT, or POST /quitquitquit): the
	// proxy takes no new pod and drains. The components that carry
	// traffic (xDS, certificates, re-authorization) and the ports run on
	// until the drain is over.
	stopping, quit := context.WithCancel(ctx)
	defer quit()
	var draining atomic.Bool
	// Ready: the tables are in, the first ZDS snapshot is served with
	// every pod in it, every served identity has its certificate, and the
	// proxy is not draining. During an upgrade this is what lets the old
	// proxy go (the chart's maxSurge): the new one must then serve every
	// pod on its own.
	ready := func() bool {
		select {
		case <-xc.Ready():
		default:
			return false
		}
		return !draining.Load() && set.Ready() && certs.Missing() == 0
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return xc.Run(gctx) })
	g.Go(func() error { certs.Run(gctx); return nil })
	g.Go(func() error { bundle.Run(gctx, cfg.rootReload); return nil })
	// Open inbound connections are re-authorized on each table change.
	g.Go(func() error { px.Run(gctx); return nil })
	zdsCtx, stopZDS := context.WithCancel(gctx)
	defer stopZDS()
	context.AfterFunc(stopping, stopZDS)
	g.Go(func() error {
		select { // serve pods only once the tables are in
		case <-xc.Ready():
		case <-zdsCtx.Done():
			return nil
		}
		return zdsclient.Client{Path: cfg.zdsSocket, Handler: set, Log: log}.Run(zdsCtx)
	})
	sources := admin.Sources{Table: table, Certs: certs.Current, Roots: certs.TrustedRoots, Pods: set.Pods, Version: version.Get(), Quit: quit, DNS: dnsView,
		Config: map[string]any{"xdsAddress": cfg.xdsAddr, "caAddress": cfg.caAddr, "clusterId": cfg.clusterID, "nodeName": cfg.nodeName}}
	httpserve.Run(gctx, g, "admin", "tcp", cfg.adminAddr, admin.Handler(sources), log)
	httpserve.Run(gctx, g, "metrics", "tcp", cfg.metricsAddr, promhttp.HandlerFor(registry, promhttp.HandlerOpts{}), log)
	httpserve.Run(gctx, g, "readiness", "tcp", cfg.readyAddr, admin.Readiness(ready), log)
	log.Info("canopy-node started", "node", cfg.nodeName, "xds", cfg.xdsAddr, "version", version.Get())
	select {
	case <-stopping.Done():
	case <-gctx.Done(): // a component failed: drain all the same
	}
	// Hand over (node/README.md, "Upgrades"): no new pod (ZDS closed, so
	// the agent sends new pods to the newest proxy), no new connection,
	// and what was accepted gets the drain period to finish.
	draining.Store(true)
	stopZDS()
	log.Info("draining", "period", cfg.drain)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.drain)
	px.Drain(dctx)
	cancel()
	stopRun()
	return g.Wait()
}
