package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/localcluster/containerinit"
)

// Config configures a Provider.
type Config struct {
	NodeName string
	// NodeIP is the node's address: the host IP of pods, and the pod IP of
	// host-network pods.
	NodeIP string
	// StateDir holds a directory per pod (volumes, resolv.conf, logs).
	StateDir string
	// CNIConfDir and CNIBinDir are the node's CNI configuration and
	// plugins, as a container runtime is configured.
	CNIConfDir, CNIBinDir string
	// Images maps an image repository (the image name without tag or
	// digest) to the absolute path of the program it runs.
	Images map[string]string
	// SelfBinary is a binary whose main runs containerinit.Main for
	// containerinit.Arg; containers start through it.
	SelfBinary string
	// ClusterDNS is the DNS server in pods' resolv.conf; ClusterDomain the
	// cluster's DNS domain (default cluster.local).
	ClusterDNS, ClusterDomain string
	// APIServiceHost and APIServicePort become KUBERNETES_SERVICE_HOST and
	// KUBERNETES_SERVICE_PORT in every container.
	APIServiceHost, APIServicePort string
	// HostPaths maps hostPath volume paths to node-local directories, so
	// that nodes sharing one machine keep node-local files apart: e.g.
	// /etc/cni/net.d to the node's CNI config directory. A path under a
	// key maps to the same place under its value. Paths under
	// SharedHostPaths are used as they are; every other host path maps
	// under <StateDir>/root.
	HostPaths map[string]string
	// CNIHostPaths are host paths CNI plugins see as this node's (mapped
	// like hostPath volumes): where a CNI agent's DaemonSet leaves its
	// socket for the plugin, say. Empty runs plugins as libcni does.
	CNIHostPaths []string
	// ClientCAFile, when set, makes the kubelet serve logs and
	// port-forward on NodeIP:10250 over TLS to clients with a certificate
	// from this CA (the API server's kubelet client certificate).
	ClientCAFile string
	// CgroupParent is the cgroup (a directory of the cgroup v2 hierarchy)
	// under which this node's pods run: each pod's processes are born in
	// <CgroupParent>/kubepods/pod<uid>, as a kubelet with the cgroupfs
	// driver places them, so that a pod's processes carry its UID (a CNI
	// agent finds a pod's network namespace by it). Empty leaves the
	// processes in the kubelet's own cgroup.
	CgroupParent string
	// RestartBackoff is the first delay before restarting a container; it
	// doubles up to MaxRestartBackoff. Defaults 1s and 30s: shorter than a
	// kubelet's, for a development cluster.
	RestartBackoff, MaxRestartBackoff time.Duration
	Client                            kubernetes.Interface `json:"-"`
	Log                               *slog.Logger         `json:"-"`
}

// SharedHostPaths are host paths every node sees as they are: kernel
// interfaces and the network namespace pins (which a CNI agent on a node
// must see to reach that node's pods).
var SharedHostPaths = []string{"/proc", "/sys", "/dev", "/lib/modules", "/run/netns", "/var/run/netns"}

// hostPath maps a hostPath volume's path to where it lives for this node.
func (c Config) hostPath(path string) string {
	path = filepath.Clean(path)
	for _, shared := range SharedHostPaths {
		if under(path, shared) {
			return path
		}
	}
	// The longest matching key wins.
	best := ""
	for k := range c.HostPaths {
		if under(path, k) && len(k) > len(best) {
			best = k
		}
	}
	if best != "" {
		return filepath.Join(c.HostPaths[best], strings.TrimPrefix(path, best))
	}
	return filepath.Join(c.StateDir, "root", path)
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

func (c Config) withDefaults() Config {
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = time.Second
	}
	if c.MaxRestartBackoff == 0 {
		c.MaxRestartBackoff = 30 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Provider runs the pods of one node. It implements nodeutil.Provider and
// node.PodNotifier.
type Provider struct {
	cfg  Config
	net  *network
	vols volumeSource
	log  *slog.Logger

	mu     sync.Mutex
	pods   map[string]*podRuntime // by namespace/name
	notify func(*corev1.Pod)
}

var _ nodeutil.Provider = (*Provider)(nil)

// NewProvider returns a Provider after removing what an earlier run of the
// same node left behind (processes, network namespaces, pod directories):
// virtual-kubelet creates the node's pods again.
func NewProvider(cfg Config) (*Provider, error) {
	cfg = cfg.withDefaults()
	if cfg.SelfBinary == "" || !filepath.IsAbs(cfg.SelfBinary) {
		return nil, fmt.Errorf("kubelet: SelfBinary %q must be an absolute path", cfg.SelfBinary)
	}
	var cniExec invoke.Exec
	if len(cfg.CNIHostPaths) > 0 {
		e := nodeViewExec{self: cfg.SelfBinary}
		for _, hp := range cfg.CNIHostPaths {
			src := cfg.hostPath(hp)
			if err := os.MkdirAll(src, 0o755); err != nil {
				return nil, fmt.Errorf("kubelet: node directory for %s: %w", hp, err)
			}
			e.mounts = append(e.mounts, containerinit.Mount{Source: src, Target: hp})
		}
		cniExec = e
	}
	p := &Provider{
		cfg:  cfg,
		net:  newNetwork(cfg.CNIConfDir, cfg.CNIBinDir, filepath.Join(cfg.StateDir, "cni-cache"), cniExec),
		vols: volumeSource{client: cfg.Client},
		log:  cfg.Log.With("component", "kubelet", "node", cfg.NodeName),
		pods: map[string]*podRuntime{},
	}
	if err := p.cleanupLeftovers(context.Background()); err != nil {
		return nil, err
	}
	return p, nil
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// NotifyPods implements node.PodNotifier.
func (p *Provider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = cb
}

func (p *Provider) publish(pod *corev1.Pod) {
	p.mu.Lock()
	cb := p.notify
	p.mu.Unlock()
	if cb != nil {
		cb(pod)
	}
}

// CreatePod implements node.PodLifecycleHandler. The pod starts in the
// background; its status tells how far it got.
func (p *Provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.pods[key]
	if ok && old.pod.UID == pod.UID {
		return nil
	}
	if ok {
		// The name was reused by a new pod (a StatefulSet, a forced
		// replace): the old one's processes and network go first.
		go old.stop(0)
	}
	r := newPodRuntime(p, pod.DeepCopy())
	p.pods[key] = r
	r.wg.Add(1)
	go r.run()
	return nil
}

// UpdatePod implements node.PodLifecycleHandler. A pod's containers are
// immutable; only its metadata is kept up to date.
func (p *Provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	r, ok := p.pods[podKey(pod.Namespace, pod.Name)]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s not found", pod.Namespace, pod.Name)
	}
	r.updateMeta(pod)
	return nil
}

// DeletePod implements node.PodLifecycleHandler. It stops the pod in the
// background and publishes its terminal status when done.
func (p *Provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	r, ok := p.pods[key]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s not found", key)
	}
	go func() {
		r.stop(gracePeriod(pod))
		p.mu.Lock()
		if p.pods[key] == r {
			delete(p.pods, key)
		}
		p.mu.Unlock()
		// As a kubelet does once a pod's containers are gone: remove the
		// object now rather than when its grace period runs out.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			p.log.Warn("final delete of pod failed", "pod", key, "err", err)
		}
	}()
	return nil
}

// gracePeriod is how long containers get between SIGTERM and SIGKILL: the
// deletion's, else the pod's, else Kubernetes' default of 30 s, as a
// kubelet gives. Shortening it would cut what a pod does in its grace (a
// node proxy's drain, which the upgrade test measures).
func gracePeriod(pod *corev1.Pod) time.Duration {
	if s := pod.DeletionGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second
}

// GetPod implements node.PodLifecycleHandler.
func (p *Provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, name)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
	}
	return r.snapshot(), nil
}

// GetPodStatus implements node.PodLifecycleHandler.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods implements node.PodLifecycleHandler.
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	rs := make([]*podRuntime, 0, len(p.pods))
	for _, r := range p.pods {
		rs = append(rs, r)
	}
	p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.snapshot())
	}
	sort.Slice(out, func(i, j int) bool {
		return podKey(out[i].Namespace, out[i].Name) < podKey(out[j].Namespace, out[j].Name)
	})
	return out, nil
}

// GetContainerLogs implements nodeutil.Provider: the container's output.
// (The local cluster serves no kubelet API yet, so kubectl logs cannot reach
// it; the files are under the node's state directory.)
func (p *Provider) GetContainerLogs(_ context.Context, namespace, podName, containerName string, _ api.ContainerLogOpts) (io.ReadCloser, error) {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, podName)
	}
	f, err := os.Open(r.logPath(containerName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFoundf("no logs for container %s", containerName)
	}
	return f, err
}

// RunInContainer implements nodeutil.Provider; exec is not supported.
func (p *Provider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errdefs.InvalidInput("exec is not supported by the local cluster")
}

// AttachToContainer implements nodeutil.Provider; attach is not supported.
func (p *Provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errdefs.InvalidInput("attach is not supported by the local cluster")
}

// GetStatsSummary implements nodeutil.Provider; no stats are collected.
func (p *Provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return &statsv1alpha1.Summary{}, nil
}

// GetMetricsResource implements nodeutil.Provider; no metrics are collected.
func (p *Provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

// PortForward implements nodeutil.Provider: it connects stream to port on
// the pod's loopback, inside the pod's network namespace, as a container
// runtime does (so ports bound to 127.0.0.1 are reachable too).
func (p *Provider) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s not found", namespace, podName)
	}
	r.mu.Lock()
	path, hostNetwork := r.netnsPath, r.pod.Spec.HostNetwork
	r.mu.Unlock()
	var conn net.Conn
	dial := func() error {
		var err error
		d := net.Dialer{Timeout: 5 * time.Second}
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		return err
	}
	var err error
	switch {
	case hostNetwork:
		err = dial() // the kubelet runs in the node's network namespace
	case path == "":
		return errdefs.InvalidInputf("pod %s/%s has no network namespace yet", namespace, podName)
	default:
		err = netns.Do(path, dial)
	}
	if err != nil {
		return fmt.Errorf("port-forward to %s/%s:%d: %w", namespace, podName, port, err)
	}
	defer conn.Close()
	// Both directions run to their end: a client that half-closes after
	// its request still gets the whole answer.
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(stream, conn)
		_ = stream.Close() // ends the other copy too
		done <- struct{}{}
	}()
	for range 2 {
		select {
		case <-done:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}
