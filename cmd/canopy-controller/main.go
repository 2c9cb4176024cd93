// Command canopy-controller is Canopy's control plane: it watches the
// cluster, keeps the workload, service and authorization tables current and
// serves them to node proxies over Delta ADS (plaintext on 15010, TLS on
// 15012 beside the CA), with health, metrics, proxy status and the tables
// on its monitoring port.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/debug"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/controller/status"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/cmdmain"
	"github.com/canopy-mesh/canopy/internal/httpserve"
	"github.com/canopy-mesh/canopy/internal/kubeconfig"
	"github.com/canopy-mesh/canopy/internal/version"
)

type config struct {
	kubeconfig      string
	monitorAddr     string
	debugAddr       string
	logLevel        slog.Level
	problemInterval time.Duration
	mesh            ambient.Config

	// The CA.
	secureAddr          string
	caNamespace         string
	caCertsDir          string
	caDNSNames          []string
	trustedNodeAccounts []identity.Account
	tokenAudiences      []string

	// Workload xDS.
	xdsAddr string
	xds     xds.Config
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("canopy-controller", flag.ContinueOnError)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&c.monitorAddr, "monitoring-addr", ":15014", "address of the monitoring port (/healthz, /readyz, /metrics, /version)")
	// The debug views hold the whole mesh's configuration: loopback only
	// by default, reached through a port-forward (canopyctl does).
	fs.StringVar(&c.debugAddr, "debug-addr", "127.0.0.1:15015", "address of the debug views (/debug/tables, /debug/syncz, /debug/config_dump); empty: none")
	fs.StringVar(&c.mesh.ClusterID, "cluster-id", "Kubernetes", "cluster ID in workload UIDs")
	fs.StringVar(&c.mesh.Network, "network", "", "network of this cluster's workloads when the system namespace has no topology.istio.io/network label")
	fs.StringVar(&c.mesh.SystemNamespace, "system-namespace", "istio-system", "namespace whose topology.istio.io/network label names the network")
	fs.StringVar(&c.mesh.TrustDomain, "trust-domain", "cluster.local", "trust domain of workload identities")
	fs.StringVar(&c.mesh.DomainSuffix, "domain-suffix", "cluster.local", "cluster DNS domain")
	fs.StringVar(&c.mesh.RootNamespace, "root-namespace", "istio-system", "namespace of mesh-wide policies")
	fs.Func("default-export-to", `comma-separated exportTo of Services and ServiceEntries that set none, as Istio's meshConfig.defaultServiceExportTo: "*" (all namespaces, the default), "." (their own), "~" (none)`, func(v string) error {
		c.mesh.DefaultExportTo = nil
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.mesh.DefaultExportTo = append(c.mesh.DefaultExportTo, e)
			}
		}
		if len(c.mesh.DefaultExportTo) == 0 {
			return fmt.Errorf("empty list")
		}
		return nil
	})
	fs.DurationVar(&c.problemInterval, "problem-interval", 5*time.Second, "how often unsupported input is checked and reported as Events")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.secureAddr, "secure-addr", ":15012", "address of the CA (TLS gRPC)")
	fs.StringVar(&c.caCertsDir, "cacerts-dir", "./etc/cacerts", "directory of a plug-in CA's files (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); used when it holds ca-cert.pem")
	caNamespace := os.Getenv("POD_NAMESPACE")
	if caNamespace == "" {
		caNamespace = "istio-system"
	}
	fs.StringVar(&c.caNamespace, "ca-namespace", caNamespace, "namespace of the CA's Secrets (default $POD_NAMESPACE, else istio-system)")
	dnsNames := fs.String("ca-dns-names", "", "comma-separated DNS names of the CA's serving certificate (default canopy-controller.<ns>.svc and istiod.<ns>.svc)")
	trusted := fs.String("trusted-node-accounts", "", "comma-separated namespace/serviceaccount that may impersonate pods of their node (default <ca-namespace>/canopy-node)")
	audiences := fs.String("token-audiences", "istio-ca", "comma-separated audiences callers' tokens must carry")
	fs.StringVar(&c.xdsAddr, "xds-addr", ":15010", "address of plaintext workload xDS (empty: TLS on --secure-addr only); callers still present tokens")
	fs.DurationVar(&c.xds.Quiet, "push-quiet", 100*time.Millisecond, "how long the tables must be unchanged before a push")
	fs.DurationVar(&c.xds.MaxDelay, "push-max-delay", time.Second, "longest a change waits for a push")
	fs.DurationVar(&c.xds.SendTimeout, "xds-send-timeout", 30*time.Second, "how long a proxy may take to read a response before it is disconnected")
	fs.IntVar(&c.xds.MaxPending, "xds-max-pending", 10000, "changed names queued per proxy before it is compared against the whole table")
	id := os.Getenv("POD_NAME")
	if id == "" {
		id, _ = os.Hostname()
	}
	fs.StringVar(&c.xds.ID, "id", id, "this instance's name in proxy status (default $POD_NAME, else the host name)")
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
	if *dnsNames == "" {
		*dnsNames = "canopy-controller." + c.caNamespace + ".svc,istiod." + c.caNamespace + ".svc"
	}
	c.caDNSNames = strings.Split(*dnsNames, ",")
	if *trusted == "" {
		*trusted = c.caNamespace + "/canopy-node"
	}
	for _, a := range strings.Split(*trusted, ",") {
		ns, name, ok := strings.Cut(strings.TrimSpace(a), "/")
		if !ok || ns == "" || name == "" {
			return c, fmt.Errorf("--trusted-node-accounts: %q is not namespace/serviceaccount", a)
		}
		c.trustedNodeAccounts = append(c.trustedNodeAccounts, identity.Account{Namespace: ns, Name: name})
	}
	c.tokenAudiences = strings.Split(*audiences, ",")
	if c.problemInterval <= 0 {
		return c, fmt.Errorf("--problem-interval must be positive, got %s", c.problemInterval)
	}
	for _, a := range []struct{ flag, addr string }{{"--monitoring-addr", c.monitorAddr}, {"--secure-addr", c.secureAddr}, {"--xds-addr", c.xdsAddr}, {"--debug-addr", c.debugAddr}} {
		if a.addr == "" && (a.flag == "--xds-addr" || a.flag == "--debug-addr") {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return c, fmt.Errorf("%s %q: %w", a.flag, a.addr, err)
		}
	}
	if c.xds.Quiet <= 0 || c.xds.MaxDelay < c.xds.Quiet || c.xds.SendTimeout <= 0 || c.xds.MaxPending <= 0 {
		return c, fmt.Errorf("--push-quiet and --xds-send-timeout must be positive, --push-max-delay at least --push-quiet, --xds-max-pending positive")
	}
	c.xds.SystemNamespace = c.caNamespace
	return c, nil
}

func main() {
	cmdmain.Run("canopy-controller", parseFlags, func(c config) slog.Level { return c.logLevel }, run)
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	rc, err := kubeconfig.Load(cfg.kubeconfig)
	if err != nil {
		return err
	}
	clients := kubeinput.Clients{}
	if clients.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	if clients.Istio, err = istioclient.NewForConfig(rc); err != nil {
		return err
	}
	if clients.Gateway, err = gatewayclient.NewForConfig(rc); err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clients.Kube.CoreV1().Events("")})
	reporter := status.NewReporter(broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "canopy-controller"}))

	tables := index.New(cfg.mesh)
	var watcher *kubeinput.Watcher
	ready := func() bool {
		select {
		case <-watcher.Synced():
			return true
		default:
			return false
		}
	}
	registry := prometheus.NewRegistry()
	ca, err := newCA(ctx, cfg, clients.Kube, registry, log)
	if err != nil {
		return err
	}
	cfg.xds.Registerer = registry
	xdsServer, err := xds.New(cfg.xds, tables, ca.authenticator, log)
	if err != nil {
		return err
	}
	xdsServer.Register(ca.grpc)
	watcher = kubeinput.New(clients, tables, func(cs index.ChangeSet) {
		log.Debug("tables changed",
			"addresses_added", len(cs.Addresses.Added), "addresses_updated", len(cs.Addresses.Updated),
			"addresses_removed", len(cs.Addresses.Removed), "authorizations_changed",
			len(cs.Authorizations.Added)+len(cs.Authorizations.Updated)+len(cs.Authorizations.Removed))
		xdsServer.Changed(cs)
	}, log)
	monitor := http.NewServeMux()
	monitor.Handle("/", debug.Health(ready))
	monitor.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	// canopyctl version reads the running binary's version here.
	monitor.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, version.Get()) })

	g, ctx := errgroup.WithContext(ctx)
	ca.start(ctx, g)
	g.Go(func() error { return watcher.Run(ctx) })
	g.Go(func() error { return xdsServer.Run(ctx, watcher.Synced()) })
	if cfg.xdsAddr != "" {
		plain := grpc.NewServer(grpc.MaxRecvMsgSize(grpcRecvLimit))
		xdsServer.Register(plain)
		serveGRPC(ctx, g, plain, cfg.xdsAddr, "plaintext xDS", log)
	}
	g.Go(func() error {
		// Problems are reported once the initial lists are in (before, a
		// problem may only mean its cause, a Gateway say, is not listed
		// yet), then every few seconds, which batches the named-port checks.
		select {
		case <-watcher.Synced():
		case <-ctx.Done():
			return nil
		}
		tick := time.NewTicker(cfg.problemInterval)
		defer tick.Stop()
		for {
			reporter.Report(tables.Problems())
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	})
	log.Info("canopy-controller started", "version", version.Get())
	httpserve.Run(ctx, g, "monitoring port", "tcp", cfg.monitorAddr, monitor, log)
	if cfg.debugAddr != "" {
		debugViews := http.NewServeMux()
		debugViews.Handle("/debug/tables", debug.TablesHandler(tables))
		proxyStatus := xdsServer.DebugHandler()
		debugViews.Handle("/debug/syncz", proxyStatus)
		debugViews.Handle("/debug/config_dump", proxyStatus)
		httpserve.Run(ctx, g, "debug views", "tcp", cfg.debugAddr, debugViews, log)
	}
	return g.Wait()
}
