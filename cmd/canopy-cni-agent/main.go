// Command canopy-cni-agent is Canopy's CNI node agent (a DaemonSet): it
// installs the canopy-cni plugin into the node's CNI chain and keeps it
// there, enrolls the node's ambient pods (in-pod redirection, host probe
// rules, ZDS to the node proxy) and keeps verifying them against the
// kernel. With --uninstall, or when it stops because its DaemonSet is being
// deleted, it takes every pod out of the mesh and removes itself from the
// node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/hostrules"
	"github.com/canopy-mesh/canopy/cni/install"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/removal"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/cmdmain"
	"github.com/canopy-mesh/canopy/internal/httpserve"
	"github.com/canopy-mesh/canopy/internal/kubeconfig"
	"github.com/canopy-mesh/canopy/internal/version"
)

type config struct {
	kubeconfig      string
	nodeName        string
	confDir, binDir string
	pluginBinary    string
	pluginSocket    string
	zdsSocket       string
	backend         string
	probeUID        int64
	probeSNAT       netip.Addr
	reconcile       time.Duration
	monitorAddr     string
	hostNetns       string
	uninstall       bool
	podName, podNS  string
	logLevel        slog.Level
	enroll          enroll.Config
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("canopy-cni-agent", flag.ContinueOnError)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node (default $NODE_NAME)")
	fs.StringVar(&c.confDir, "cni-conf-dir", "/etc/cni/net.d", "the node's CNI configuration directory")
	fs.StringVar(&c.binDir, "cni-bin-dir", "/opt/cni/bin", "the node's CNI plugin directory")
	exe, _ := os.Executable()
	fs.StringVar(&c.pluginBinary, "plugin-binary", filepath.Join(filepath.Dir(exe), "canopy-cni"), "the canopy-cni binary to install")
	fs.StringVar(&c.pluginSocket, "plugin-socket", "/var/run/canopy/cni.sock", "where the plugin reaches the agent")
	fs.StringVar(&c.zdsSocket, "zds-socket", "/var/run/ztunnel/ztunnel.sock", "where the node proxy connects (ZDS)")
	fs.StringVar(&c.backend, "backend", "nftables", "redirection backend: nftables (over netlink) or iptables (iptables-restore)")
	fs.Int64Var(&c.probeUID, "probe-uid", -1, "user ID of the kubelet, whose probes are SNATed (default: found in /proc)")
	snat := fs.String("probe-snat", redirect.DefaultProbeSNAT.String(), "address kubelet probes are SNATed to")
	fs.DurationVar(&c.reconcile, "reconcile-period", 30*time.Second, "how often every pod's rules are verified in its netns")
	fs.StringVar(&c.monitorAddr, "monitoring-addr", ":15024", "address of /metrics, /healthz and /readyz")
	fs.StringVar(&c.hostNetns, "host-netns", "", "netns path of the node's host rules (default: the agent's own)")
	fs.BoolVar(&c.uninstall, "uninstall", false, "take every pod of the node out of the mesh, remove the plugin and the host rules, and exit")
	fs.StringVar(&c.podName, "pod-name", os.Getenv("POD_NAME"), "this agent's pod: when its DaemonSet is being deleted, stopping uninstalls (default $POD_NAME)")
	fs.StringVar(&c.podNS, "pod-namespace", os.Getenv("POD_NAMESPACE"), "this agent's namespace (default $POD_NAMESPACE)")
	fs.StringVar(&c.enroll.SystemNamespace, "system-namespace", "istio-system", "namespace of the node proxy pods (never enrolled)")
	excluded := fs.String("excluded-namespaces", "kube-system", "comma-separated namespaces never enrolled")
	// Off by default until the node proxy answers DNS on 15053.
	fs.BoolVar(&c.enroll.DNSCapture, "dns-capture", false, "redirect pods' DNS to the node proxy (15053) unless a pod's annotation says otherwise")
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
	if c.nodeName == "" {
		return c, errors.New("--node-name (or $NODE_NAME) is required")
	}
	if c.backend != "nftables" && c.backend != "iptables" {
		return c, fmt.Errorf("--backend %q: want nftables or iptables", c.backend)
	}
	var err error
	if c.probeSNAT, err = netip.ParseAddr(*snat); err != nil || !c.probeSNAT.Is4() {
		return c, fmt.Errorf("--probe-snat %q: want an IPv4 address", *snat)
	}
	if c.reconcile <= 0 {
		return c, fmt.Errorf("--reconcile-period must be positive, got %s", c.reconcile)
	}
	if c.probeUID < -1 || c.probeUID > 1<<32-1 {
		return c, fmt.Errorf("--probe-uid %d is not a user ID", c.probeUID)
	}
	for _, ns := range strings.Split(*excluded, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			c.enroll.ExcludedNamespaces = append(c.enroll.ExcludedNamespaces, ns)
		}
	}
	return c, nil
}

func main() {
	cmdmain.Run("canopy-cni-agent", parseFlags, func(c config) slog.Level { return c.logLevel }, run)
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	rc, err := kubeconfig.Load(cfg.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var backend redirect.Backend = redirect.Nftables{}
	if cfg.backend == "iptables" {
		backend = redirect.Iptables{}
	}
	uid := uint32(cfg.probeUID)
	if cfg.probeUID < 0 {
		if uid, err = hostrules.FindKubeletUID("/proc"); err != nil {
			log.Warn("no kubelet process found; SNATing probes from root (set --probe-uid)", "err", err)
			uid = 0
		}
	}
	host := hostrules.Rules{ProbeUID: uid, ProbeSNAT: cfg.probeSNAT, Netns: cfg.hostNetns}
	var a *agent.Agent
	proxy := zds.New(cfg.zdsSocket, zds.Config{OnDelivered: func(uid string) { a.Delivered(uid) }}, log)
	registry := prometheus.NewRegistry()
	a, err = agent.New(agent.Config{NodeName: cfg.nodeName, Enroll: cfg.enroll, ReconcilePeriod: cfg.reconcile, Registerer: registry},
		kube, backend, host, proxy, log)
	if err != nil {
		return err
	}
	installer := install.Installer{
		ConfDir: cfg.confDir, BinDir: cfg.binDir, PluginBinary: cfg.pluginBinary,
		Entry: map[string]any{"agentSocket": cfg.pluginSocket, "excludeNamespaces": cfg.enroll.ExcludedNamespaces}, Log: log,
	}

	if cfg.uninstall {
		return uninstall(ctx, a, installer, log)
	}

	// The loop outlives the signal by a moment: stopping must first ask
	// whether the DaemonSet is being deleted, and then take the node out
	// of the mesh with the rules still verified.
	signalled := ctx
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g, ctx := errgroup.WithContext(runCtx)
	if err := installer.Install(); err != nil && !errors.Is(err, install.ErrNoPrimary) {
		return fmt.Errorf("install the plugin: %w", err)
	}
	// The watch restores the plugin whenever the configuration changes: it
	// must have stopped before an uninstall removes the plugin, or it
	// would put it straight back.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	g.Go(func() error {
		defer close(watchDone)
		return installer.Watch(watchCtx)
	})
	uninstallWatch := removal.New(kube, cfg.podNS, cfg.podName, log)
	g.Go(func() error { return uninstallWatch.Run(ctx) })
	var removing atomic.Bool
	g.Go(func() error {
		select {
		case <-signalled.Done():
		case <-ctx.Done():
			return nil
		}
		defer stopRun()
		checkCtx, cancel := context.WithTimeout(runCtx, 5*time.Second)
		defer cancel()
		gone, err := uninstallWatch.Removed(checkCtx)
		if err != nil {
			log.Warn("cannot tell whether the DaemonSet is being deleted; staying installed", "err", err)
			return nil
		}
		if gone {
			log.Info("the DaemonSet is being deleted: taking the node out of the mesh")
			removing.Store(true)
			stopWatch()
			<-watchDone
			if err := installer.Uninstall(); err != nil {
				log.Error("remove the plugin", "err", err)
			}
		}
		return nil
	})
	g.Go(func() error { return a.Run(ctx) })
	g.Go(func() error {
		// The node proxy treats a snapshot as complete: open ZDS only once
		// the agent knows the node's pods.
		select {
		case <-a.Synced():
		case <-ctx.Done():
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(cfg.zdsSocket), 0o755); err != nil {
			return err
		}
		return proxy.Run(ctx)
	})
	httpserve.Run(ctx, g, "plugin events", "unix", cfg.pluginSocket, a.PluginHandler(), log)
	monitor := http.NewServeMux()
	monitor.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	monitor.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	monitor.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, version.Get()) })
	monitor.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-a.Synced():
			fmt.Fprintln(w, "ok")
		default:
			http.Error(w, "not synced", http.StatusServiceUnavailable)
		}
	})
	httpserve.Run(ctx, g, "monitoring", "tcp", cfg.monitorAddr, monitor, log)
	log.Info("canopy-cni-agent started", "node", cfg.nodeName, "backend", backend.Name(), "probe_uid", uid, "version", version.Get())
	err = g.Wait()
	if removing.Load() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), 30*time.Second)
		defer cancel()
		if uerr := a.Uninstall(ctx); uerr != nil {
			return errors.Join(err, fmt.Errorf("un-enroll: %w", uerr))
		}
		log.Info("uninstalled: every pod of the node is out of the mesh")
	}
	return err
}

// uninstall takes the node out of the mesh: the plugin out of the chain
// first (no new pod is enrolled meanwhile), the agent's loop stopped once
// it has found every pod (it would enroll them again), then every pod
// un-enrolled and the host rules removed.
func uninstall(ctx context.Context, a *agent.Agent, installer install.Installer, log *slog.Logger) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	select {
	case <-a.Synced():
	case err := <-done:
		return fmt.Errorf("agent ended before it synced: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := installer.Uninstall(); err != nil {
		return fmt.Errorf("remove the plugin: %w", err)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	if err := a.Uninstall(ctx); err != nil {
		return fmt.Errorf("un-enroll: %w", err)
	}
	log.Info("uninstalled: every pod of the node is out of the mesh")
	return nil
}
