// Command canopy-cni-agent is Canopy's CNI node agent (a DaemonSet): it
// installs the canopy-cni plugin into the node's CNI chain and keeps it
// there, enrolls the node's ambient pods (in-pod redirection, host probe
// rules, ZDS to the node proxy), installs the capture of its
// sidecar-injected pods (--sidecar-capture), and keeps verifying them
// against the kernel. With --uninstall, or when it stops because its DaemonSet is being
// deleted, it takes every pod out of the mesh and removes itself from the
// node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/hostrules"
	"github.com/canopy-mesh/canopy/cni/install"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/cni/removal"
	"github.com/canopy-mesh/canopy/cni/taint"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/cmdmain"
	"github.com/canopy-mesh/canopy/internal/kubeconfig"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/version"
)

type config struct {
	kubeconfig      string
	nodeName        string
	confDir, binDir string
	confFile        string
	pluginBinary    string
	pluginSocket    string
	zdsSocket       string
	backend         string
	bpfRoot         string
	guardPorts      bool
	guardRoot       string
	cgroupRoot      string
	probeUID        int64
	probeSNAT       netip.Addr
	reconcile       time.Duration
	monitorAddr     string
	hostNetns       string
	stateDir        string
	namespaceRecord string
	startupTaint    string
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
	fs.StringVar(&c.confFile, "cni-conf-file", "", "Canopy's own CNI configuration file in --cni-conf-dir, a .conflist named to sort before the primary CNI's (the primary's plugins and canopy-cni; it survives the primary rewriting its file at a node's boot); empty chains canopy-cni into the primary's file")
	exe, _ := os.Executable()
	fs.StringVar(&c.pluginBinary, "plugin-binary", filepath.Join(filepath.Dir(exe), "canopy-cni"), "the canopy-cni binary to install")
	fs.StringVar(&c.pluginSocket, "plugin-socket", "/var/run/canopy/cni.sock", "where the plugin reaches the agent")
	fs.StringVar(&c.zdsSocket, "zds-socket", "/var/run/ztunnel/ztunnel.sock", "where the node proxy connects (ZDS)")
	fs.StringVar(&c.backend, "backend", "nftables", "redirection backend: nftables (over netlink), iptables (iptables-restore) or ebpf (sk_lookup and tcx programs in each pod; needs Canopy's node proxy)")
	fs.StringVar(&c.bpfRoot, "bpf-root", sockmap.DefaultRoot, "the directory on the node's BPF filesystem where the ebpf backend pins each pod's programs and maps (a BPF filesystem is mounted on its parent when there is none), and where another backend looks for pods the ebpf backend left, to take them over; the node proxy must look in the same place")
	fs.BoolVar(&c.guardPorts, "guard-proxy-ports", true, "keep every process of an ambient pod but the node proxy from binding the proxy's ports in the pod (15001, 15006, 15008, 15053), with cgroup bind programs on the node (Linux 6.10); where the kernel cannot, ambient pods are refused. Off, a root process of a pod can join the proxy's listeners and take a share of the pod's connections")
	fs.StringVar(&c.guardRoot, "guard-root", "/sys/fs/bpf/canopy-guard", "the directory on the node's BPF filesystem where the port guard's programs and maps are pinned, in a directory named after the node (a BPF filesystem is mounted on its parent when there is none); not under --bpf-root")
	fs.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "the node's cgroup2 hierarchy (or, on a cgroup v1 node, the directory holding it as unified), where the port guard is attached: the node's own, not a container's cgroup namespace view")
	fs.Int64Var(&c.probeUID, "probe-uid", 0, "user ID of the kubelet: the node's TCP connections to enrolled pods from this user are SNATed as probes")
	snat := fs.String("probe-snat", redirect.DefaultProbeSNAT.String(), "address kubelet probes are SNATed to")
	fs.DurationVar(&c.reconcile, "reconcile-period", 30*time.Second, "how often every pod's rules are verified in its netns")
	fs.StringVar(&c.monitorAddr, "monitoring-addr", ":15024", "address of /metrics, /healthz and /readyz")
	fs.StringVar(&c.hostNetns, "host-netns", "", "netns path of the node's host rules (default: the agent's own)")
	fs.StringVar(&c.namespaceRecord, "namespace-record", pluginevent.DefaultNamespaceRecord, "file where the agent records the namespaces outside the mesh, whose pods the plugin lets start while the agent is unreachable (empty: none, every pod waits for the agent)")
	fs.StringVar(&c.startupTaint, "startup-taint", taint.DefaultKey, "key of the taint the node registers with and the agent removes once its plugin is in the CNI chain and a self-test enrollment passed (empty: none)")
	fs.StringVar(&c.stateDir, "state-dir", "/var/run/canopy", "the agent's directory on the node: what it keeps there (each pod's network namespace, as its CNI ADD gave it) outlives an agent restart; a tmpfs, since a reboot ends every namespace")
	fs.BoolVar(&c.uninstall, "uninstall", false, "take every pod of the node out of the mesh, remove the plugin and the host rules, and exit")
	fs.StringVar(&c.podName, "pod-name", os.Getenv("POD_NAME"), "this agent's pod: when its DaemonSet is being deleted, stopping uninstalls (default $POD_NAME)")
	fs.StringVar(&c.podNS, "pod-namespace", os.Getenv("POD_NAMESPACE"), "this agent's namespace (default $POD_NAMESPACE)")
	fs.StringVar(&c.enroll.SystemNamespace, "system-namespace", "istio-system", "namespace of the node proxy pods (never enrolled)")
	excluded := fs.String("excluded-namespaces", "kube-system", "comma-separated namespaces never enrolled")
	fs.BoolVar(&c.enroll.DNSCapture, "dns-capture", true, "redirect ambient pods' DNS (UDP and TCP 53) to the node proxy's 15053 once a node proxy has acknowledged the pod, unless the pod's ambient.istio.io/dns-capture annotation says otherwise; until then a pod's DNS goes to its resolvers")
	fs.BoolVar(&c.enroll.SidecarCapture, "sidecar-capture", true, "install the traffic capture of sidecar-injected pods (injected for a CNI plugin: istio-validation, no istio-init) within their CNI ADD; off, pods with a sidecar are left alone")
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
	if errs := validation.IsDNS1123Subdomain(c.nodeName); len(errs) > 0 {
		return c, fmt.Errorf("--node-name %q: %s", c.nodeName, strings.Join(errs, "; "))
	}
	if errs := validation.IsQualifiedName(c.startupTaint); c.startupTaint != "" && len(errs) > 0 {
		return c, fmt.Errorf("--startup-taint %q: %s", c.startupTaint, strings.Join(errs, "; "))
	}
	switch c.backend {
	case "nftables", "iptables", "ebpf":
		if !filepath.IsAbs(c.bpfRoot) || filepath.Clean(c.bpfRoot) == "/" {
			return c, fmt.Errorf("--bpf-root %q: want an absolute directory below a BPF filesystem's mount point", c.bpfRoot)
		}
		c.bpfRoot = filepath.Clean(c.bpfRoot)
	default:
		return c, fmt.Errorf("--backend %q: want nftables, iptables or ebpf", c.backend)
	}
	if !filepath.IsAbs(c.guardRoot) || filepath.Clean(c.guardRoot) == "/" {
		return c, fmt.Errorf("--guard-root %q: want an absolute directory below a BPF filesystem's mount point", c.guardRoot)
	}
	c.guardRoot = filepath.Clean(c.guardRoot)
	if rel, err := filepath.Rel(c.bpfRoot, c.guardRoot); err == nil && !strings.HasPrefix(rel, "..") {
		return c, fmt.Errorf("--guard-root %q: not under --bpf-root %q, whose entries are pods", c.guardRoot, c.bpfRoot)
	}
	var err error
	if c.probeSNAT, err = netip.ParseAddr(*snat); err != nil || !c.probeSNAT.Is4() {
		return c, fmt.Errorf("--probe-snat %q: want an IPv4 address", *snat)
	}
	if c.reconcile <= 0 {
		return c, fmt.Errorf("--reconcile-period must be positive, got %s", c.reconcile)
	}
	if c.probeUID < 0 || c.probeUID > 1<<32-1 {
		return c, fmt.Errorf("--probe-uid %d is not a user ID (the kubelet is not looked up among the node's processes: give its user ID)", c.probeUID)
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
	backend, err := newBackend(cfg)
	if err != nil {
		return err
	}
	backend, admit, closeGuard := guardBackend(cfg, backend, log)
	defer closeGuard()
	uid := probeUID(cfg)
	// The in-pod rules accept IPv6 probes from the default address only.
	host := hostrules.Rules{ProbeUID: uid, ProbeSNAT: cfg.probeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: cfg.hostNetns}
	var a *agent.Agent
	proxy := zds.New(cfg.zdsSocket, zds.Config{OnDelivered: func(uid string) { a.Delivered(uid) }, Admit: admit}, log)
	registry := prometheus.NewRegistry()
	a, err = agent.New(agent.Config{
		NodeName: cfg.nodeName, Enroll: cfg.enroll, ReconcilePeriod: cfg.reconcile,
		StateDir: cfg.stateDir, NamespaceRecord: cfg.namespaceRecord, Registerer: registry,
	},
		kube, backend, host, proxy, log)
	if err != nil {
		return err
	}
	entry := map[string]any{"agentSocket": cfg.pluginSocket, "excludeNamespaces": cfg.enroll.ExcludedNamespaces}
	if cfg.namespaceRecord != "" {
		entry["namespaceRecord"] = cfg.namespaceRecord
	}
	installer := install.Installer{ConfDir: cfg.confDir, BinDir: cfg.binDir, OwnedFile: cfg.confFile, PluginBinary: cfg.pluginBinary, Entry: entry, Log: log}
	var startupTaint agent.StartupTaint
	if cfg.startupTaint != "" {
		startupTaint = taint.Remover{Kube: kube, Node: cfg.nodeName, Key: cfg.startupTaint}
	}
	return agent.RunLifecycle(ctx, agent.LifecycleConfig{
		Uninstall:    cfg.uninstall,
		PluginSocket: cfg.pluginSocket,
		ZDSSocket:    cfg.zdsSocket,
		MonitorAddr:  cfg.monitorAddr,
		Describe:     []any{"node", cfg.nodeName, "backend", backend.Name(), "probe_uid", uid, "sidecar_capture", cfg.enroll.SidecarCapture, "guard_proxy_ports", cfg.guardPorts},
	}, agent.Components{
		Agent:   a,
		Plugin:  installer,
		Removal: removal.New(kube, cfg.podNS, cfg.podName, log),
		Proxy:   proxy,
		Taint:   startupTaint,
		Metrics: registry,
	}, log)
}

// newBackend makes the configured redirection backend. The eBPF one is
// checked against the kernel first, and the iptables one for its
// binaries, so that an agent without what it needs fails at start,
// naming it, rather than at each pod; the eBPF one's pins need the node's
// BPF filesystem.
func newBackend(cfg config) (redirect.Backend, error) {
	switch cfg.backend {
	case "nftables", "iptables":
		var b redirect.Backend = redirect.Nftables{}
		if cfg.backend == "iptables" {
			ipt := redirect.Iptables{}
			if err := ipt.Probe(); err != nil {
				// Canopy's own agent image carries no iptables.
				return nil, fmt.Errorf("%w (the nftables backend needs no binary)", err)
			}
			b = ipt
		}
		// Pods the eBPF backend enrolled before the node changed backend
		// keep its programs until they are enrolled again, and then lose
		// them: never captured twice for longer than that.
		if entries, err := os.ReadDir(cfg.bpfRoot); err == nil && len(entries) > 0 {
			return redirect.LeavingEbpf{Backend: b, Root: cfg.bpfRoot}, nil
		}
		return b, nil
	case "ebpf":
		if err := bpfprog.Probe(); err != nil {
			return nil, err
		}
		if err := sockmap.MountBPFFS(filepath.Dir(cfg.bpfRoot)); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(cfg.bpfRoot, 0o700); err != nil {
			return nil, fmt.Errorf("create --bpf-root: %w", err)
		}
		return redirect.Ebpf{Root: cfg.bpfRoot}, nil
	}
	return nil, fmt.Errorf("unknown backend %q", cfg.backend)
}

// guardBackend wraps the backend in the port guard (redirect.Guarded)
// and returns what registers a node proxy with it, for ZDS, and what
// closes it. A node whose kernel cannot guard refuses its ambient pods,
// saying why (redirect.Unguardable), rather than enroll them with ports a
// process of the pod could take; --guard-proxy-ports=false runs without
// the guard, as Canopy did before it.
func guardBackend(cfg config, b redirect.Backend, log *slog.Logger) (redirect.Backend, func(int) error, func()) {
	if !cfg.guardPorts {
		log.Warn("--guard-proxy-ports=false: a root process of an ambient pod can bind the node proxy's ports and take a share of the pod's connections")
		return b, nil, func() {}
	}
	g, err := openGuard(cfg, log)
	if err != nil {
		log.Error("cannot guard the node proxy's ports in pods: ambient pods are refused", "err", err)
		return redirect.Guarded{Backend: b, Guard: redirect.Unguardable{Err: err}}, nil, func() {}
	}
	return redirect.Guarded{Backend: b, Guard: g}, g.Admit, g.Close
}

// openGuard attaches the port guard to the node's cgroup2 root, or takes
// over the one pinned under --guard-root. Its pins must outlive the
// agent, on the node's BPF filesystem (the chart mounts it from the host
// with bidirectional propagation). They are in a directory of the node's
// name: agents of several nodes that share a kernel (a local cluster)
// each keep their own guard, whose programs all apply, each to its own
// pods and proxies, and none forgets or removes another's.
func openGuard(cfg config, log *slog.Logger) (*redirect.PortGuard, error) {
	if err := sockmap.MountBPFFS(filepath.Dir(cfg.guardRoot)); err != nil {
		return nil, err
	}
	return redirect.OpenPortGuard(redirect.PortGuardConfig{Root: filepath.Join(cfg.guardRoot, cfg.nodeName), Cgroup: cfg.cgroupRoot, Log: log})
}

// probeUID is the user ID whose connections to enrolled pods are SNATed as
// kubelet probes. It comes from configuration only: anything read from the
// node's processes (a process name, say) a pod can fake.
func probeUID(cfg config) uint32 { return uint32(cfg.probeUID) }

// What the lifecycle drives, from the packages that implement it.
var (
	_ agent.PluginInstaller = install.Installer{}
	_ agent.RemovalWatch    = (*removal.Watcher)(nil)
	_ agent.ProxyServer     = (*zds.Server)(nil)
	_ agent.StartupTaint    = taint.Remover{}
	_ agent.SocketBackend   = redirect.Ebpf{}
	_ agent.GuardBackend    = redirect.Guarded{}
	_ redirect.NetnsGuard   = (*redirect.PortGuard)(nil)
)
