// Package agent is the CNI node agent's core: it enrolls the node's
// ambient pods (in-pod redirection, host probe set, ZDS to the node
// proxy, the pod's annotation) and installs the capture of its
// sidecar-injected pods (in-pod rules only) when the plugin asks and
// whenever the cluster says a pod should be in the mesh, and un-enrolls
// them when it should not. Enrollment is a level-triggered loop that trusts the kernel,
// not its memory: every period, and at start, every pod's rules are
// verified in its netns and repaired when they drifted, and the verified
// state is published on the pod and in metrics.
//
// RunLifecycle (lifecycle.go) is the agent's life on its node, around that
// loop: the plugin installed into the CNI chain and kept there, ZDS opened
// once the loop has synced, and, when the agent's DaemonSet is being
// deleted or --uninstall asks, the node taken out of the mesh in an order
// that never leaves a pod enrolled by accident. cmd/canopy-cni-agent only
// builds its parts.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// Proxy is the node proxy as the agent reaches it; *zds.Server
// implements it.
type Proxy interface {
	Add(p zds.Pod) error
	Delete(uid string) error
}

// HostRules are the node's probe rules; hostrules.Rules implements them.
type HostRules interface {
	Sync(ips []netip.Addr) error
	Add(ips ...netip.Addr) error
	Remove(ips ...netip.Addr) error
	Verify(ips []netip.Addr) ([]string, error)
	Delete() error
}

// Config configures an Agent.
type Config struct {
	NodeName string
	Enroll   enroll.Config
	// ReconcilePeriod is how often every pod is verified (default 30s).
	ReconcilePeriod time.Duration
	// StatusRefresh is how often an unchanged verified state is written
	// to the pod (default 5m): the condition's lastProbeTime says when the
	// agent last saw the rules in place.
	StatusRefresh time.Duration
	// ProcRoot is where the node's processes are seen (default /proc): a
	// pod whose CNI ADD the agent did not record is found by the cgroup
	// of its processes, which carries the pod's UID.
	ProcRoot string
	// StateDir is the agent's directory on the node; what it keeps there
	// outlives an agent restart: the network namespace each pod's CNI ADD
	// gave (pods/<uid>.json). Empty keeps nothing.
	StateDir string
	// NamespaceRecord is where the agent keeps the record of the
	// namespaces whose pods may start while the plugin cannot reach it
	// (pluginevent.NamespaceRecord). Empty keeps none: the plugin then
	// fails every pod while the agent is unreachable.
	NamespaceRecord string
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// selfTestPod is the pod configuration the self-test enrolls with: the
// node's defaults.
func (c Config) selfTestPod() redirect.PodConfig {
	cfg := redirect.DefaultPodConfig()
	cfg.DNSCapture = c.Enroll.DNSCapture
	return cfg
}

func (c Config) withDefaults() Config {
	if c.ReconcilePeriod <= 0 {
		c.ReconcilePeriod = 30 * time.Second
	}
	if c.StatusRefresh <= 0 {
		c.StatusRefresh = 5 * time.Minute
	}
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Agent enrolls the pods of one node.
type Agent struct {
	cfg     Config
	kube    kubernetes.Interface
	backend redirect.Backend
	host    HostRules
	proxy   Proxy
	log     *slog.Logger
	metrics *metrics
	finder  netnsFinder
	records records

	pods       listerscorev1.PodLister
	namespaces listerscorev1.NamespaceLister
	synced     chan struct{}
	wake       chan struct{}
	recordWake chan struct{}

	// locks serializes the work on each pod; mu guards the tables below
	// and is never held across I/O (locks.go).
	locks podLocks
	mu    sync.Mutex
	// enrolled are the pods in the mesh.
	enrolled map[types.UID]*member
	// probeIPs are the IPs the host probe set must hold, counted by pod;
	// probeGen changes with them and with every write of the set,
	// probeWrites counts the writes in flight.
	probeIPs    map[netip.Addr]int
	probeGen    uint64
	probeWrites int

	// enrolling counts the enrollments under way by the inode of their
	// network namespace: an ambient pod's namespace is guarded (and its
	// eBPF pins made) before the node proxy acknowledges it, and only then
	// is the pod a member. enrollingMu is held while a pass prunes the
	// guard (collectPins), so an enrollment is counted here or a member
	// by the time the pass looks, or it starts after the pruning.
	enrollingMu sync.Mutex
	enrolling   map[uint64]int
}

// member is an enrolled pod as the agent holds it. Its fields change only
// under the pod's lock.
type member struct {
	namespace, name string
	uid             types.UID
	// netns is the agent's handle on the pod's namespace: the rules are
	// checked through it, whatever happens to the path it came from.
	netns *os.File
	ips   []netip.Addr
	// cfg is the redirection the pod asks for; the netns holds
	// m.rules(), which differs from it until a node proxy serves the pod.
	cfg redirect.PodConfig
	// state is the redirection annotation's value.
	state string
	// served: a node proxy acknowledged the pod (this agent's ZDS, or an
	// earlier agent's for an adopted pod annotated enabled), so its
	// listeners in the pod, DNS included, are open.
	served bool
	// verified is the last time the rules were seen in place; published
	// is the last time that was written to the pod.
	verified, published time.Time
	// unregistered are the slots of the pod's socket map its node proxy
	// has not filled (a SocketBackend only).
	unregistered []sockmap.Slot
}

func (m *member) path() string { return fmt.Sprintf("/proc/self/fd/%d", m.netns.Fd()) }

// sidecar reports whether the member is a sidecar pod, whose own proxy
// takes its traffic.
func (m *member) sidecar() bool { return m.cfg.Sidecar != nil }

// rules is the redirection the member's netns holds now (phased).
func (m *member) rules() redirect.PodConfig { return phased(m.cfg, m.served) }

// phased is the redirection an ambient pod gets while served says
// whether a node proxy has acknowledged it: DNS capture only once one
// has. Outbound and inbound TCP are captured from the start (traffic
// fails closed until a proxy takes the pod), but a pod's DNS must keep
// going to its resolvers until something answers on 15053, or the pod
// could not even resolve the names it waits for.
//
// Once on, capture stays while the pod is enrolled, through the node
// proxy's absences too: node proxies keep their pods across restarts and
// a successor takes them from the ZDS snapshot, as TCP capture assumes.
// Turning DNS capture off when the proxy goes and on when one comes back
// would rewrite every pod's rules at each proxy restart for a few
// seconds of DNS going around the mesh.
//
// A sidecar pod's DNS capture is its own Envoy's (ISTIO_META_DNS_CAPTURE)
// and is never phased.
func phased(cfg redirect.PodConfig, served bool) redirect.PodConfig {
	if cfg.Sidecar == nil && !served {
		cfg.DNSCapture = false
	}
	return cfg
}

// New returns an Agent.
func New(cfg Config, kube kubernetes.Interface, backend redirect.Backend, host HostRules, proxy Proxy, log *slog.Logger) (*Agent, error) {
	cfg = cfg.withDefaults()
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is required")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Agent{
		cfg: cfg, kube: kube, backend: backend, host: host, proxy: proxy, metrics: m,
		log:        log.With("component", "cni-agent", "backend", backend.Name()),
		finder:     netnsFinder{procRoot: cfg.ProcRoot},
		records:    records{dir: stateSubdir(cfg.StateDir, recordsDir)},
		synced:     make(chan struct{}),
		wake:       make(chan struct{}, 1),
		recordWake: make(chan struct{}, 1),
		enrolled:   map[types.UID]*member{},
		probeIPs:   map[netip.Addr]int{},
	}, nil
}

func stateSubdir(dir, sub string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, sub)
}

// Synced is closed once the agent has listed the node's pods and made its
// first pass over them.
func (a *Agent) Synced() <-chan struct{} { return a.synced }

// Run watches the node's pods and their namespaces and reconciles until
// ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	podInformers := informers.NewSharedInformerFactoryWithOptions(a.kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()
	}))
	nsInformers := informers.NewSharedInformerFactory(a.kube, 0)
	podInformer := podInformers.Core().V1().Pods()
	nsInformer := nsInformers.Core().V1().Namespaces()
	a.pods, a.namespaces = podInformer.Lister(), nsInformer.Lister()
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke(); a.pokeRecord() },
		UpdateFunc: func(any, any) { a.poke(); a.pokeRecord() },
		DeleteFunc: func(any) { a.poke(); a.pokeRecord() },
	}
	if _, err := podInformer.Informer().AddEventHandler(poke); err != nil {
		return err
	}
	if _, err := nsInformer.Informer().AddEventHandler(poke); err != nil {
		return err
	}
	podInformers.Start(ctx.Done())
	nsInformers.Start(ctx.Done())
	defer podInformers.Shutdown()
	defer nsInformers.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.Informer().HasSynced, nsInformer.Informer().HasSynced) {
		return nil
	}
	// The host rules are rewritten with the IPs of the ambient pods the
	// first pass will enroll, which an agent that restarts finds there
	// already: their kubelet probes never miss the rule. The pass then
	// enrolls what already runs, repairs what drifted while the agent was
	// away, and drops from the set what it could not enroll.
	if err := a.host.Sync(a.ambientIPs()); err != nil {
		return fmt.Errorf("host probe rules: %w", err)
	}
	if a.cfg.NamespaceRecord != "" {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { a.keepNamespaceRecord(ctx) })
	}
	a.reconcile(ctx)
	close(a.synced)
	tick := time.NewTicker(a.cfg.ReconcilePeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-a.wake:
		}
		a.reconcile(ctx)
	}
}

func (a *Agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *Agent) pokeRecord() {
	select {
	case a.recordWake <- struct{}{}:
	default:
	}
}

// decide looks up a pod's namespace and applies the enrollment rules. An
// error is a pod for the mesh whose settings cannot be applied.
func (a *Agent) decide(pod *corev1.Pod) (enroll.Decision, error) {
	ns, _ := a.namespaces.Get(pod.Namespace)
	return enroll.Decide(pod, ns, a.cfg.Enroll)
}

// ambientIPs are the IPs of the node's running pods that belong in the
// mesh as ambient pods, from the informer's view.
func (a *Agent) ambientIPs() []netip.Addr {
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	var ips []netip.Addr
	for _, pod := range pods {
		if d, err := a.decide(pod); err == nil && d.Enroll && d.Pod.Sidecar == nil && running(pod) {
			ips = append(ips, podIPs(pod)...)
		}
	}
	return ips
}

// podIPs returns a pod's IPs from its status.
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			out = append(out, a)
		}
	}
	return out
}
