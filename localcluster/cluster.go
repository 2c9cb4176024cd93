package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/localcluster/kubelet"
)

// Cluster is a running local cluster.
type Cluster struct {
	State  *State
	Client kubernetes.Interface
}

// managedBy marks the EndpointSlices the local cluster writes itself.
const managedBy = "canopy-local"

// cniHostPaths are the host paths each node's CNI plugins see as the
// node's own (where a CNI agent leaves its socket for the plugin); each
// is a mount point on the host while the cluster runs. Read-only.
var cniHostPaths = []string{"/var/run/canopy"}

// extraControllers are what a cluster with kubelets needs beyond the test
// environment's base set.
var extraControllers = []string{"daemonset", "statefulset", "job", "root-ca-cert-publisher", "podgc", "nodelifecycle"}

// Up starts a cluster and returns when its nodes are Ready, kube-proxy has
// synced on every node and DNS answers. A cluster of the same name that was
// not brought down (its processes gone, say after a reboot) is cleaned up
// first; one that still runs is an error. On failure, what was started is
// removed again.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if old, err := loadState(cfg.StateDir); err == nil {
		for _, p := range old.Processes {
			if p.Alive() {
				return nil, fmt.Errorf("cluster %q is already up (state in %s): run canopy-local down first", cfg.Name, cfg.StateDir)
			}
		}
		cfg.Log.Info("removing the remains of an earlier run", "cluster", cfg.Name)
		if err := Down(ctx, cfg.StateDir); err != nil {
			return nil, fmt.Errorf("clean up earlier run: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("state of an earlier run (remove %s by hand if it is not a cluster): %w", cfg.StateDir, err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	st := &State{Name: cfg.Name, Dir: cfg.StateDir}
	if err := st.save(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if logs, logErr := saveLogs(cfg.StateDir); logErr == nil {
				err = fmt.Errorf("%w (component logs saved in %s)", err, logs)
			}
			if downErr := Down(context.Background(), cfg.StateDir); downErr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed up: %w", downErr))
			}
		}
	}()
	u := &upper{cfg: cfg, st: st}
	if err := u.run(ctx); err != nil {
		return nil, err
	}
	return &Cluster{State: st, Client: u.client}, nil
}

// upper carries one Up through its steps.
type upper struct {
	cfg     Config
	st      *State
	client  kubernetes.Interface
	apiPort int
	// kubeletClientCA is what kubelets require of the API server.
	kubeletClientCA string
}

func (u *upper) run(ctx context.Context) error {
	cfg, st := u.cfg, u.st
	hostAddr := netip.PrefixFrom(cfg.hostIP(), cfg.Underlay.Bits())
	// Pods' processes run in cgroups carrying their UID, as on a real
	// node, under one cgroup for the whole cluster.
	cgroupRoot, err := cgroup.Root()
	if err != nil {
		return fmt.Errorf("the local cluster puts pods in cgroups: %w", err)
	}
	st.Cgroup = filepath.Join(cgroupRoot, "canopy-local-"+cfg.Name)
	st.Bridge = cfg.bridge()
	if err := st.save(); err != nil {
		return err
	}
	if err := createBridge(st.Bridge, hostAddr); err != nil {
		return err
	}
	// The CNI agent's eBPF backend pins each pod's programs and maps on the
	// node's BPF filesystem, which a node's init system mounts at boot and
	// this machine may lack. It stays mounted after down, as on a node.
	if err := sockmap.MountBPFFS("/sys/fs/bpf"); err != nil {
		return err
	}

	env, err := testenv.Start(ctx, testenv.Options{
		BinDir:                cfg.Binaries.KubeDir,
		Etcd:                  cfg.Binaries.Etcd,
		BindAddress:           cfg.hostIP().String(),
		ServiceClusterIPRange: cfg.ServiceCIDR.String(),
		Dir:                   filepath.Join(cfg.StateDir, "control-plane"),
		ExtraControllers:      extraControllers,
		// The API server runs on the host, outside every node, where no
		// kube-proxy programs Service addresses: it reaches webhooks (the
		// sidecar injector) at their Services' endpoints instead, as a
		// control plane without kube-proxy does.
		APIServerArgs: []string{"--enable-aggregator-routing=true"},
		Detached:      true,
		Log:           cfg.Log,
	})
	// Record what started even when the start failed later on.
	if env != nil {
		for _, p := range env.Processes() {
			if err := st.addProcess(p.Name, p.PID); err != nil {
				return err
			}
		}
	}
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	u.client = env.Client
	st.Kubeconfig, st.APIServer = env.KubeconfigPath, env.Config.Host
	u.kubeletClientCA = env.KubeletClientCA
	server, err := url.Parse(st.APIServer)
	if err != nil {
		return fmt.Errorf("parse API server URL: %w", err)
	}
	if u.apiPort, err = strconv.Atoi(server.Port()); err != nil {
		return fmt.Errorf("API server URL %s has no port", st.APIServer)
	}
	if err := st.save(); err != nil {
		return err
	}

	if err := u.publishAPIServer(ctx); err != nil {
		return err
	}
	if err := u.startDNS(ctx); err != nil {
		return err
	}
	st.Runtime = cfg.Runtime
	if cfg.Runtime == RuntimeContainerd {
		st.NodeCgroup = cfg.cgroup()
		st.Self = cfg.Binaries.Self
		if err := u.startRegistry(ctx); err != nil {
			return err
		}
		if err := u.grantKubeletAPI(ctx); err != nil {
			return err
		}
	}
	for i := 1; i <= cfg.Nodes; i++ {
		if err := u.startNode(ctx, i); err != nil {
			return fmt.Errorf("node %s: %w", cfg.nodeName(i), err)
		}
	}
	scheduler := []string{cfg.Binaries.Self, "scheduler", "--kubeconfig", st.Kubeconfig}
	if cfg.Runtime == RuntimeContainerd {
		// Real nodes get the real scheduler; it leads alone.
		scheduler = []string{filepath.Join(cfg.Binaries.KubeDir, "kube-scheduler"), "--kubeconfig=" + st.Kubeconfig,
			"--leader-elect=false", "--bind-address=" + cfg.hostIP().String(), "--secure-port=10259"}
	}
	if err := u.spawn("scheduler", "", scheduler...); err != nil {
		return err
	}
	if err := u.waitReady(ctx); err != nil {
		return err
	}
	st.Ready = true
	return st.save()
}

// spawn starts a detached, long-lived process, inside a network namespace
// when netnsPath is set, with its output in <state>/logs/<name>.log.
func (u *upper) spawn(name, netnsPath string, argv ...string) error {
	logDir := filepath.Join(u.cfg.StateDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := cmd.Start
	if netnsPath != "" {
		start = func() error { return netns.Do(netnsPath, cmd.Start) }
	}
	if err := start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	// Reap it if it dies while this process lives; a detached process
	// outlives us otherwise.
	go func() {
		_ = cmd.Wait()
		logFile.Close()
	}()
	return u.st.addProcess(name, cmd.Process.Pid)
}

// publishAPIServer points the "kubernetes" Service at the API server, as
// the API server's own endpoint reconciler would if it allowed a loopback or
// bridge address: pods reach it at the Service VIP.
func (u *upper) publishAPIServer(ctx context.Context) error {
	return u.applySlice(ctx, metav1.NamespaceDefault, "kubernetes", []discoveryv1.EndpointPort{
		{Name: ptr.To("https"), Port: ptr.To(int32(u.apiPort)), Protocol: ptr.To(corev1.ProtocolTCP)},
	})
}

// applySlice writes the EndpointSlice of a selector-less Service, pointing
// at the host's underlay address.
func (u *upper) applySlice(ctx context.Context, ns, service string, ports []discoveryv1.EndpointPort) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      service + "-" + managedBy,
			Namespace: ns,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   managedBy,
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{u.cfg.hostIP().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: ports,
	}
	_, err := u.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("write EndpointSlice for %s/%s: %w", ns, service, err)
	}
	return nil
}

// startDNS runs CoreDNS on the host's underlay address and publishes it as
// the kube-dns Service at the cluster DNS VIP.
func (u *upper) startDNS(ctx context.Context) error {
	cfg := u.cfg
	host := cfg.hostIP().String()
	corefile := fmt.Sprintf(`.:53 {
    bind %[1]s
    errors
    ready %[1]s:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %[2]s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
`, host, u.st.Kubeconfig)
	path := filepath.Join(cfg.StateDir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return fmt.Errorf("write Corefile: %w", err)
	}
	if err := u.spawn("coredns", "", cfg.Binaries.CoreDNS, "-conf", path); err != nil {
		return err
	}
	_, err := u.client.CoreV1().Services(metav1.NamespaceSystem).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: cfg.dnsServiceIP().String(),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create kube-dns Service: %w", err)
	}
	return u.applySlice(ctx, metav1.NamespaceSystem, "kube-dns", []discoveryv1.EndpointPort{
		{Name: ptr.To("dns"), Port: ptr.To(int32(53)), Protocol: ptr.To(corev1.ProtocolUDP)},
		{Name: ptr.To("dns-tcp"), Port: ptr.To(int32(53)), Protocol: ptr.To(corev1.ProtocolTCP)},
	})
}

// KubeletConfig is the file a node's kubelet stand-in reads.
type KubeletConfig struct {
	Kubeconfig string           `json:"kubeconfig"`
	Node       kubelet.NodeInfo `json:"node"`
	Kubelet    kubelet.Config   `json:"kubelet"`
}

func (u *upper) startNode(ctx context.Context, i int) error {
	cfg, st := u.cfg, u.st
	name := cfg.nodeName(i)
	path, err := netns.Create(cfg.nodeNetns(i))
	if err != nil {
		return err
	}
	st.Netns = append(st.Netns, path)
	st.HostLinks = append(st.HostLinks, cfg.hostLink(i))
	node := Node{Name: name, IP: cfg.nodeIP(i).String(), PodCIDR: cfg.nodePodCIDR(i).String(), Netns: path, Zone: cfg.nodeZone(i)}
	st.Nodes = append(st.Nodes, node)
	if err := st.save(); err != nil {
		return err
	}
	peers := map[netip.Prefix]netip.Addr{}
	for j := 1; j <= cfg.Nodes; j++ {
		if j != i {
			peers[cfg.nodePodCIDR(j)] = cfg.nodeIP(j)
		}
	}
	if err := connectNode(st.Bridge, nodeNetwork{
		netnsPath: path,
		hostLink:  cfg.hostLink(i),
		addr:      netip.PrefixFrom(cfg.nodeIP(i), cfg.Underlay.Bits()),
		gateway:   cfg.hostIP(),
		podCIDR:   cfg.nodePodCIDR(i),
		peers:     peers,
	}); err != nil {
		return err
	}
	if err := addHostRoute(cfg.nodePodCIDR(i), cfg.nodeIP(i)); err != nil {
		return err
	}
	if cfg.Runtime == RuntimeContainerd {
		if err := u.startRealNode(ctx, i, node); err != nil {
			return err
		}
		return u.startKubeProxy(name, path, node.IP)
	}

	dir := filepath.Join(cfg.StateDir, "nodes", name)
	confDir, binDir := filepath.Join(dir, "cni", "net.d"), filepath.Join(dir, "cni", "bin")
	if err := writeCNI(cfg, i, dir, confDir, binDir); err != nil {
		return err
	}
	kc := KubeletConfig{
		Kubeconfig: st.Kubeconfig,
		Node: kubelet.NodeInfo{
			Name:    name,
			IP:      node.IP,
			PodCIDR: node.PodCIDR,
			Labels: map[string]string{
				corev1.LabelTopologyRegion: cfg.Region,
				corev1.LabelTopologyZone:   node.Zone,
			},
			KubeletVersion: "canopy-local",
			Taints:         cfg.NodeTaints,
		},
		Kubelet: kubelet.Config{
			NodeName:       name,
			NodeIP:         node.IP,
			StateDir:       dir,
			CNIConfDir:     confDir,
			CNIBinDir:      binDir,
			Images:         cfg.images(),
			SelfBinary:     cfg.Binaries.Self,
			ClusterDNS:     cfg.dnsServiceIP().String(),
			APIServiceHost: cfg.apiServiceIP().String(),
			APIServicePort: "443",
			// A CNI agent's DaemonSet installs itself through these
			// paths, as on a real node.
			HostPaths: map[string]string{"/etc/cni/net.d": confDir, "/opt/cni/bin": binDir},
			// Where a CNI agent leaves its socket for the plugin.
			CNIHostPaths: cniHostPaths,
			CgroupParent: filepath.Join(st.Cgroup, name),
			// Logs and port-forward: the API server's client certificate.
			ClientCAFile: u.kubeletClientCA,
		},
	}
	b, err := json.MarshalIndent(kc, "", "  ")
	if err != nil {
		return err
	}
	kcPath := filepath.Join(dir, "kubelet.json")
	if err := os.WriteFile(kcPath, b, 0o600); err != nil {
		return err
	}
	if err := u.spawn("kubelet-"+name, path, cfg.Binaries.Self, "kubelet", "--config", kcPath); err != nil {
		return err
	}
	return u.startKubeProxy(name, path, node.IP)
}

// startKubeProxy runs a node's kube-proxy in the node's network namespace,
// a process as clusters without a kube-proxy DaemonSet run it.
func (u *upper) startKubeProxy(name, netnsPath, nodeIP string) error {
	cfg, st := u.cfg, u.st
	return u.spawn("kube-proxy-"+name, netnsPath, filepath.Join(cfg.Binaries.KubeDir, "kube-proxy"),
		"--kubeconfig="+st.Kubeconfig,
		"--hostname-override="+name,
		"--proxy-mode=nftables",
		"--cluster-cidr="+cfg.PodCIDR.String(),
		"--bind-address="+nodeIP,
		"--healthz-bind-address="+nodeIP+":10256",
		"--metrics-bind-address="+nodeIP+":10249",
		// Leave the host-wide conntrack settings alone.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
	)
}

// images is the image table: canopy/echo, plus what the caller adds.
func (c Config) images() map[string]string {
	m := map[string]string{
		"canopy/echo": c.Binaries.Echo,
		"canopy-echo": c.Binaries.Echo,
	}
	for k, v := range c.Images {
		m[k] = v
	}
	return m
}

// writeCNI gives a node its CNI configuration and plugins, as a node image
// would: ptp with host-local IPAM from the node's pod CIDR.
func writeCNI(cfg Config, i int, dir, confDir, binDir string) error {
	for _, d := range []string{confDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, plugin := range []string{"ptp", "host-local", "loopback"} {
		if err := copyFile(filepath.Join(cfg.Binaries.CNIDir, plugin), filepath.Join(binDir, plugin)); err != nil {
			return fmt.Errorf("install CNI plugin %s: %w", plugin, err)
		}
	}
	// The stand-in's nodes share the host's file system: IPAM state per
	// node.
	b, err := primaryCNIConfig(cfg.nodePodCIDR(i).String(), filepath.Join(dir, "cni", "ipam"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(confDir, "10-canopy-local.conflist"), b, 0o644)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst+".tmp", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}

// waitReady waits for Ready nodes, synced kube-proxies and answering DNS.
func (u *upper) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	httpc := &http.Client{Timeout: time.Second}
	check := func(what string, f func(context.Context) (bool, error)) error {
		if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, f); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		return nil
	}
	for _, n := range u.st.Nodes {
		if err := check("node "+n.Name+" Ready", func(ctx context.Context) (bool, error) {
			node, err := u.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
		if err := check("kube-proxy on "+n.Name, func(ctx context.Context) (bool, error) {
			return httpOK(ctx, httpc, "http://"+n.IP+":10256/healthz"), nil
		}); err != nil {
			return err
		}
	}
	return check("CoreDNS", func(ctx context.Context) (bool, error) {
		return httpOK(ctx, httpc, "http://"+u.cfg.hostIP().String()+":8181/ready"), nil
	})
}

func httpOK(ctx context.Context, c *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// saveLogs copies every *.log under dir into a new temporary directory, so
// that a failed Up can be diagnosed after its cleanup.
func saveLogs(dir string) (string, error) {
	out, err := os.MkdirTemp("", "canopy-local-logs-")
	if err != nil {
		return "", err
	}
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".log" {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(out, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return copyFile(path, dst)
	})
	return out, err
}

// Load returns the cluster whose state is in dir.
func Load(dir string) (*Cluster, error) {
	st, err := loadState(dir)
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Cluster{State: st, Client: client}, nil
}
