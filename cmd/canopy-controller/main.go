// Command canopy-controller is Canopy's control plane: it watches the
// cluster, keeps the workload, service and authorization tables current and
// serves them to node proxies over Delta ADS (TLS on 15012 beside the CA;
// plaintext on 15010 only when asked), with health, metrics, proxy status
// and the tables on its monitoring port.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/debug"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/inject"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/controller/leader"
	"github.com/canopy-mesh/canopy/controller/vipalloc"
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
	// authn holds the token caches and the TokenReview budget; the CA
	// fills in the clusters and audiences.
	authn authn.Config
	// certTTL is the lifetime of workload certificates.
	certTTL pki.TTLRange
	// caExpiryWarning is how long before the CA certificate's end warnings
	// start.
	caExpiryWarning time.Duration
	// caReload is how often the CA's Secret or directory is re-read.
	caReload time.Duration

	// The API client: requests per second and burst of the main client
	// (informers, ConfigMaps, Events); TokenReviews have a client of their
	// own, paced by the review budget.
	kubeQPS   float32
	kubeBurst int

	// grpcMaxStreams caps the concurrent streams of one connection to the
	// gRPC ports.
	grpcMaxStreams uint32

	// ServiceEntry VIP allocation: whether this process allocates, and
	// from which ranges. The tables read allocated VIPs either way.
	vipAllocation bool
	vipRanges     vipalloc.Ranges

	// Workload xDS. xdsAddr is the plaintext port, empty for none.
	xdsAddr string
	xds     xds.Config

	// The sidecar injection webhook: served over TLS on webhookAddr (empty
	// for none) with the CA's serving certificate, at most
	// webhookMaxRequests at once; inject is what it renders into pods.
	webhookAddr        string
	webhookMaxRequests int
	inject             inject.Config
	// validation serves Istio's validating webhook (/validate) beside
	// injection, and has the writers keep its configurations.
	validation bool

	// Leader election: whether the writers (root ConfigMaps, ServiceEntry
	// VIPs, the webhook caBundle, Events) run only while this replica
	// holds the Lease, and the Lease (Namespace: caNamespace; Identity:
	// xds.ID).
	leaderElect bool
	leader      leader.Config
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("canopy-controller", flag.ContinueOnError)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&c.monitorAddr, "monitoring-addr", ":15014", "address of the monitoring port (/healthz, /readyz, /metrics, /version)")
	// The debug views hold the whole mesh's configuration: loopback only
	// by default, reached through a port-forward (canopyctl does).
	fs.StringVar(&c.debugAddr, "debug-addr", "127.0.0.1:15015", "address of the debug views (/debug/tables, /debug/syncz, /debug/config_dump, /debug/pprof/); empty: none")
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
	fs.BoolVar(&c.vipAllocation, "serviceentry-vip-allocation", true, "allocate VIPs to ServiceEntries without addresses into their status.addresses, as istiod does (a ServiceEntry opts out with label networking.istio.io/enable-autoallocate-ip=false)")
	c.vipRanges = vipalloc.DefaultRanges()
	fs.Func("serviceentry-vip-ipv4-range", "prefix ServiceEntry IPv4 VIPs are allocated from (default "+vipalloc.DefaultIPv4Range+")", prefixFlag(&c.vipRanges.IPv4))
	fs.Func("serviceentry-vip-ipv6-range", "prefix ServiceEntry IPv6 VIPs are allocated from (default "+vipalloc.DefaultIPv6Range+")", prefixFlag(&c.vipRanges.IPv6))
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
	fs.DurationVar(&c.authn.CacheTTL, "token-cache-ttl", authn.DefaultCacheTTL, "how long a token found valid is trusted without another TokenReview")
	fs.DurationVar(&c.authn.NegativeTTL, "token-negative-cache-ttl", authn.DefaultNegativeTTL, "how long a rejected token stays rejected without another TokenReview")
	fs.Float64Var(&c.authn.ReviewQPS, "token-review-qps", authn.DefaultReviewQPS, "TokenReviews per second for tokens not in the cache; beyond it (and the burst) callers are refused with ResourceExhausted and retry; 0: no limit")
	fs.IntVar(&c.authn.ReviewBurst, "token-review-burst", authn.DefaultReviewBurst, "TokenReviews allowed at once above --token-review-qps")
	fs.DurationVar(&c.certTTL.Default, "cert-default-ttl", pki.DefaultTTL, "lifetime of a workload certificate whose request names none")
	fs.DurationVar(&c.certTTL.Min, "cert-min-ttl", pki.MinTTL, "shortest workload certificate lifetime: shorter requests get it, and the CA refuses to sign once its own certificate has less left")
	fs.DurationVar(&c.certTTL.Max, "cert-max-ttl", pki.MaxTTL, "longest workload certificate lifetime: longer requests get it (Istio's MAX_WORKLOAD_CERT_TTL is 90 days)")
	fs.DurationVar(&c.caReload, "ca-reload-period", 10*time.Second, "how often the CA's Secret (or --cacerts-dir) is re-read; a change is used without a restart")
	fs.DurationVar(&c.caExpiryWarning, "ca-expiry-warning", 30*24*time.Hour, "how long before the CA certificate expires the controller starts warning (a Warning log and Event on the CA Secret, daily)")
	var kubeQPS float64
	fs.Float64Var(&kubeQPS, "kube-api-qps", 50, "requests per second of the controller's API client (informers, root ConfigMaps, Events); TokenReviews have their own, paced by --token-review-qps")
	fs.IntVar(&c.kubeBurst, "kube-api-burst", 100, "burst of the controller's API client above --kube-api-qps")
	var grpcMaxStreams uint
	fs.UintVar(&grpcMaxStreams, "grpc-max-concurrent-streams", 100, "concurrent streams (RPCs) on one client connection to the gRPC ports; more wait for one to end")
	fs.StringVar(&c.xdsAddr, "xds-addr", "", "address of plaintext workload xDS, e.g. 127.0.0.1:15010 (default: none; xDS is served over TLS on --secure-addr); bearer tokens cross it in clear text, so an address beyond loopback needs --xds-plaintext-remote")
	remote := fs.Bool("xds-plaintext-remote", false, "let --xds-addr listen beyond loopback, where bearer tokens cross the network in clear text")
	fs.IntVar(&c.xds.MaxStreams, "xds-max-streams", xds.DefaultMaxStreams, "xDS streams open at once; more are refused with ResourceExhausted; 0: no limit")
	fs.IntVar(&c.xds.MaxStreamsPerCaller, "xds-max-streams-per-caller", xds.DefaultMaxStreamsPerCaller, "xDS streams open at once per caller (the pod of a pod-bound token, else the service account); 0: no limit")
	namesMiB := fs.Int("xds-caller-names-mib", xds.DefaultMaxNameBytesPerCaller>>20, "MiB of resource names one caller's xDS streams may hold subscribed, over all of them (each name's bytes and 128 for what the server keeps of it); a request past it ends its stream with ResourceExhausted; 0: no limit")
	fs.Float64Var(&c.xds.StreamsPerSecond, "xds-streams-per-second", xds.DefaultStreamsPerSecond, "new xDS streams per second (authenticated ones); beyond it (and the burst) a stream waits up to 1s, then is refused with ResourceExhausted; 0: no limit")
	fs.IntVar(&c.xds.StreamBurst, "xds-stream-burst", xds.DefaultStreamBurst, "new xDS streams allowed at once above --xds-streams-per-second")
	fs.DurationVar(&c.xds.Quiet, "push-quiet", 100*time.Millisecond, "how long the tables must be unchanged before a push")
	fs.DurationVar(&c.xds.MaxDelay, "push-max-delay", time.Second, "longest a change waits for a push")
	fs.DurationVar(&c.xds.SendTimeout, "xds-send-timeout", 30*time.Second, "how long a proxy may take to read a response before it is disconnected")
	fs.IntVar(&c.xds.MaxPending, "xds-max-pending", 10000, "changed names queued per proxy before it is compared against the whole table")
	budgetMiB := fs.Int("xds-send-budget-mib", xds.DefaultSendBudget>>20, "MiB of workload xDS responses encoded and not yet written to proxies, over all of them; more wait (a whole table is a few MiB at 10,000 pods)")
	fs.StringVar(&c.webhookAddr, "webhook-addr", ":15017", "address of the webhooks (HTTPS): sidecar injection (/inject) and configuration validation (/validate); empty: none")
	fs.IntVar(&c.webhookMaxRequests, "webhook-max-requests", 100, "webhook requests served at once; more wait up to a second, then are answered 503")
	fs.BoolVar(&c.validation, "validation-webhook", true, "serve Istio's validating webhook for Istio configuration (/validate on --webhook-addr) and keep the caBundle and failurePolicy of its configurations (istio-validator*, labelled istio.io/rev=<revision>)")
	fs.StringVar(&c.inject.Hub, "proxy-hub", "", "hub of the injected proxy image, <hub>/proxyv2:<tag> (Istio's proxyv2); with --proxy-tag empty too, the webhook denies the pods it would inject, saying why")
	fs.StringVar(&c.inject.Tag, "proxy-tag", "", "tag of the injected proxy image")
	discovery := fs.String("discovery-address", "", "host:port injected sidecars reach the controller's xDS and CA at (default canopy-controller.<ca-namespace>.svc:15012)")
	fs.StringVar(&c.inject.Revision, "revision", "", "control-plane revision the webhook injects for and whose webhook configurations get the CA bundle (istio.io/rev); empty: default")
	fs.BoolVar(&c.inject.CNI, "inject-cni", false, "a CNI plugin (canopy-cni-agent with --sidecar-capture, or istio-cni) installs sidecar pods' traffic capture: inject istio-validation instead of the privileged istio-init")
	fs.BoolVar(&c.inject.NativeSidecars, "inject-native-sidecars", false, "inject istio-proxy as a native sidecar (an init container with restartPolicy Always)")
	never := fs.String("never-inject-selector", "", `JSON list of label selectors ([{"matchLabels":{...}}]): selected pods that neither ask for nor refuse a sidecar and match one are not injected`)
	always := fs.String("always-inject-selector", "", `JSON list of label selectors: selected pods that neither ask for nor refuse a sidecar and match one (and no never-inject selector) are injected`)
	fs.BoolVar(&c.leaderElect, "leader-elect", true, "run the API writers (root-certificate ConfigMaps, ServiceEntry VIPs, the webhook caBundle, Events) only while holding a Lease in --ca-namespace, so that of several replicas one writes; every replica serves xDS, the CA and the webhook either way. false: always write (one replica only)")
	fs.StringVar(&c.leader.Name, "leader-election-lease", "", "name of the Lease (default canopy-controller, or canopy-controller-<revision> with a --revision other than default: each revision has writers of its own)")
	fs.DurationVar(&c.leader.LeaseDuration, "leader-lease-duration", leader.DefaultLeaseDuration, "how long a leader that stops renewing (a crash, a partition) keeps the Lease; one that stops cleanly releases it at once")
	fs.DurationVar(&c.leader.RenewDeadline, "leader-renew-deadline", leader.DefaultRenewDeadline, "how long the leader tries to renew before it stops its writers and campaigns again")
	fs.DurationVar(&c.leader.RetryPeriod, "leader-retry-period", leader.DefaultRetryPeriod, "how often the Lease is renewed, or tried for by a replica that does not hold it")
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
	if err := c.certTTL.Validate(); err != nil {
		return c, fmt.Errorf("--cert-min-ttl, --cert-default-ttl, --cert-max-ttl: %w", err)
	}
	if c.caExpiryWarning <= 0 || c.caReload <= 0 {
		return c, fmt.Errorf("--ca-expiry-warning and --ca-reload-period must be positive")
	}
	if kubeQPS <= 0 || c.kubeBurst <= 0 {
		return c, fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive")
	}
	c.kubeQPS = float32(kubeQPS)
	if grpcMaxStreams == 0 || grpcMaxStreams > math.MaxUint32 {
		return c, fmt.Errorf("--grpc-max-concurrent-streams must be between 1 and %d", uint32(math.MaxUint32))
	}
	c.grpcMaxStreams = uint32(grpcMaxStreams)
	// In the libraries zero means "the default" and negative "none".
	for _, v := range []*int{&c.xds.MaxStreams, &c.xds.MaxStreamsPerCaller} {
		if *v <= 0 {
			*v = -1
		}
	}
	c.xds.MaxNameBytesPerCaller = int64(*namesMiB) << 20
	if *namesMiB <= 0 {
		c.xds.MaxNameBytesPerCaller = -1
	}
	for _, v := range []*float64{&c.xds.StreamsPerSecond, &c.authn.ReviewQPS} {
		if *v <= 0 {
			*v = -1
		}
	}
	if c.xds.StreamBurst <= 0 || c.authn.ReviewBurst <= 0 || c.authn.CacheTTL <= 0 || c.authn.NegativeTTL <= 0 {
		return c, fmt.Errorf("--xds-stream-burst, --token-review-burst, --token-cache-ttl and --token-negative-cache-ttl must be positive")
	}
	if err := c.vipRanges.Validate(); err != nil {
		return c, fmt.Errorf("--serviceentry-vip-ipv4-range, --serviceentry-vip-ipv6-range: %w", err)
	}
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
	if c.xdsAddr != "" && !*remote && !loopback(c.xdsAddr) {
		return c, fmt.Errorf("--xds-addr %q is not a loopback address: plaintext xDS carries bearer tokens in clear text; pass --xds-plaintext-remote to serve it there anyway", c.xdsAddr)
	}
	if c.xds.Quiet <= 0 || c.xds.MaxDelay < c.xds.Quiet || c.xds.SendTimeout <= 0 || c.xds.MaxPending <= 0 {
		return c, fmt.Errorf("--push-quiet and --xds-send-timeout must be positive, --push-max-delay at least --push-quiet, --xds-max-pending positive")
	}
	if *budgetMiB <= 0 {
		return c, fmt.Errorf("--xds-send-budget-mib must be positive, not %d", *budgetMiB)
	}
	c.xds.SendBudget = xds.NewSendBudget(int64(*budgetMiB) << 20)
	c.xds.SystemNamespace = c.caNamespace
	for _, f := range []struct {
		flag, v string
		into    *[]metav1.LabelSelector
	}{{"--never-inject-selector", *never, &c.inject.NeverInjectSelector}, {"--always-inject-selector", *always, &c.inject.AlwaysInjectSelector}} {
		if f.v == "" {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(f.v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(f.into); err != nil {
			return c, fmt.Errorf("%s: want a JSON list of label selectors: %w", f.flag, err)
		}
	}
	if err := c.injectConfig(*discovery); err != nil {
		return c, err
	}
	if c.leader.Name == "" {
		c.leader.Name = "canopy-controller"
		if r := c.inject.Revision; r != "" && r != "default" {
			c.leader.Name += "-" + r
		}
	}
	c.leader.Namespace, c.leader.Identity = c.caNamespace, c.xds.ID
	if c.leaderElect {
		if err := c.leader.Validate(); err != nil {
			return c, fmt.Errorf("--leader-lease-duration, --leader-renew-deadline, --leader-retry-period: %w", err)
		}
		if c.leader.Identity == "" {
			return c, fmt.Errorf("--id is empty: leader election needs a name for this replica")
		}
	}
	return c, nil
}

// injectConfig completes and checks the injector's configuration.
func (c *config) injectConfig(discovery string) error {
	if c.webhookAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.webhookAddr); err != nil {
		return fmt.Errorf("--webhook-addr %q: %w", c.webhookAddr, err)
	}
	if c.webhookMaxRequests <= 0 {
		return fmt.Errorf("--webhook-max-requests must be positive, got %d", c.webhookMaxRequests)
	}
	if discovery == "" {
		discovery = "canopy-controller." + c.caNamespace + ".svc:15012"
	}
	if host, port, err := net.SplitHostPort(discovery); err != nil || host == "" || port == "" {
		return fmt.Errorf("--discovery-address %q is not host:port", discovery)
	}
	c.inject.DiscoveryAddress = discovery
	switch {
	case c.inject.Hub == "" && c.inject.Tag == "":
		c.inject.DenyReason = "no proxy image is configured: canopy-controller runs without --proxy-hub and --proxy-tag (chart values injection.proxy.hub and injection.proxy.tag)"
	case c.inject.Hub == "" || c.inject.Tag == "":
		return fmt.Errorf("--proxy-hub %q and --proxy-tag %q: set both or neither", c.inject.Hub, c.inject.Tag)
	}
	c.inject.TrustDomain = c.mesh.TrustDomain
	c.inject.ClusterID = c.mesh.ClusterID
	c.inject.Network = c.mesh.Network
	c.inject.ClusterDomain = c.mesh.DomainSuffix
	c.inject.SystemNamespace = c.caNamespace
	if err := c.inject.Validate(); err != nil {
		return fmt.Errorf("--proxy-hub, --proxy-tag, --discovery-address, --revision, --*-inject-selector: %w", err)
	}
	return nil
}

// prefixFlag parses a flag's value into *p.
func prefixFlag(p *netip.Prefix) func(string) error {
	return func(v string) error {
		prefix, err := netip.ParsePrefix(v)
		if err != nil {
			return err
		}
		*p = prefix
		return nil
	}
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func main() {
	cmdmain.Run("canopy-controller", parseFlags, func(c config) slog.Level { return c.logLevel }, run)
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	rc, err := kubeconfig.Load(cfg.kubeconfig)
	if err != nil {
		return err
	}
	// TokenReviews get a client of their own, so that a burst of list or
	// ConfigMap requests never queues a proxy's authentication; the review
	// budget paces it.
	reviewConfig := rest.CopyConfig(rc)
	reviewConfig.QPS, reviewConfig.Burst = -1, 0
	if q := cfg.authn.ReviewQPS; q > 0 {
		reviewConfig.QPS, reviewConfig.Burst = float32(q), cfg.authn.ReviewBurst
	}
	reviewClient, err := kubernetes.NewForConfig(reviewConfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = cfg.kubeQPS, cfg.kubeBurst
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
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "canopy-controller"})

	tables := index.New(cfg.mesh)
	// The xDS server is built after the watcher that feeds it, and the CA
	// reads pods from the watcher's index.
	var xdsServer *xds.Server
	watcher := kubeinput.New(clients, tables, func(cs index.ChangeSet) {
		log.Debug("tables changed",
			"addresses_added", len(cs.Addresses.Added), "addresses_updated", len(cs.Addresses.Updated),
			"addresses_removed", len(cs.Addresses.Removed), "authorizations_changed",
			len(cs.Authorizations.Added)+len(cs.Authorizations.Updated)+len(cs.Authorizations.Removed))
		xdsServer.Changed(cs)
	}, log)
	registry := prometheus.NewRegistry()
	w := &writers{kube: clients.Kube, istio: clients.Istio, tables: tables, synced: watcher.Synced(), recorder: recorder, log: log,
		revision: cfg.inject.Revision, patchWebhooks: cfg.webhookAddr != "", problemInterval: cfg.problemInterval,
		patchValidation: cfg.webhookAddr != "" && cfg.validation, namespace: cfg.caNamespace}
	if cfg.vipAllocation {
		w.vipAllocation, w.vipRanges = true, cfg.vipRanges
	}
	// Without leader election this process always writes.
	var elector *leader.Elector
	leading := func() bool { return true }
	if cfg.leaderElect {
		// Lease requests have a client of their own: a burst of ConfigMap
		// writes must not hold up a renewal, nor a slow request outlast
		// the renew deadline.
		leaseConfig := rest.CopyConfig(rc)
		leaseConfig.Timeout = max(cfg.leader.RenewDeadline/2, time.Second)
		leaseClient, err := kubernetes.NewForConfig(leaseConfig)
		if err != nil {
			return err
		}
		cfg.leader.Registerer = registry
		if elector, err = leader.New(cfg.leader, leaseClient.CoordinationV1(), log); err != nil {
			return err
		}
		leading = elector.Leading
	}
	ca, err := newCA(ctx, cfg, clients.Kube, authn.Reviewer{Client: reviewClient.AuthenticationV1()},
		indexPods{tables: tables, synced: watcher.Synced()}, recorder, leading, w.SetBundle, registry, log)
	if err != nil {
		return err
	}
	w.SetBundle(ca.rootBundle)
	// A new leader tells of an expiring CA at once, not at the monitor's
	// next hourly check.
	w.onTerm = ca.expiry.Check
	var hook *webhook
	if cfg.webhookAddr != "" {
		ns := indexNamespaces{tables: tables, synced: watcher.Synced(), client: clients.Kube}
		if hook, err = newWebhook(cfg, ca, ns, log); err != nil {
			return err
		}
	}
	cfg.xds.Registerer = registry
	cfg.xds.Mesh = tables
	if xdsServer, err = xds.New(cfg.xds, tables, ca.authenticator, log); err != nil {
		return err
	}
	xdsServer.Register(ca.grpc)
	// Ready once the xDS server has built its first full table from the
	// synced informers, not before: a Service would route proxies to a
	// replica whose answers hold part of the mesh. (Streams that reach it
	// earlier wait for the table.)
	ready := func() bool {
		select {
		case <-xdsServer.Ready():
			return true
		default:
			return false
		}
	}
	monitor := http.NewServeMux()
	monitor.Handle("/", debug.Health(ready))
	monitor.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	// canopyctl version reads the running binary's version here.
	monitor.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, version.Get()) })

	g, ctx := errgroup.WithContext(ctx)
	ca.start(ctx, g)
	if hook != nil {
		hook.start(ctx, g)
	}
	g.Go(func() error { return watcher.Run(ctx) })
	if elector != nil {
		log.Info("campaigning for the writers' lease", "lease", cfg.leader.Namespace+"/"+cfg.leader.Name, "identity", elector.Identity())
		g.Go(func() error { return elector.Run(ctx, w.run) })
	} else {
		log.Info("leader election off: this replica writes")
		g.Go(func() error { return w.run(ctx) })
	}
	g.Go(func() error { return xdsServer.Run(ctx, watcher.Synced()) })
	if cfg.xdsAddr != "" {
		plain := grpc.NewServer(grpcOptions(cfg)...)
		xdsServer.Register(plain)
		serveGRPC(ctx, g, plain, cfg.xdsAddr, "plaintext xDS", log)
	}
	log.Info("canopy-controller started", "version", version.Get())
	httpserve.Run(ctx, g, "monitoring port", "tcp", cfg.monitorAddr, monitor, log)
	if cfg.debugAddr != "" {
		debugViews := http.NewServeMux()
		debugViews.Handle("/debug/tables", debug.TablesHandler(tables))
		proxyStatus := xdsServer.DebugHandler()
		debugViews.Handle("/debug/syncz", proxyStatus)
		debugViews.Handle("/debug/config_dump", proxyStatus)
		// Profiles, for finding where a push's time goes (bench/controlplane
		// fetches them with CANOPY_BENCH_PROFILE_DIR).
		debugViews.HandleFunc("/debug/pprof/", pprof.Index)
		debugViews.HandleFunc("/debug/pprof/profile", pprof.Profile)
		debugViews.HandleFunc("/debug/pprof/trace", pprof.Trace)
		httpserve.Run(ctx, g, "debug views", "tcp", cfg.debugAddr, debugViews, log)
	}
	return g.Wait()
}
