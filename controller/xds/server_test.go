package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// settle is how long a condition of these tests may take to become true.
const settle = 30 * time.Second

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// mesh is a controller's xDS half against the test API server: informers,
// the index, the xDS server on a loopback port.
type mesh struct {
	addr   string
	server *xds.Server
	reg    *prometheus.Registry
	// index is the tables the server serves (nil for a fake source).
	index *index.Index
	// ns is the proxies' namespace, also the system namespace.
	ns string
	// budget is the server's send budget; its codec serves the mesh.
	budget *xds.SendBudget
}

func startMesh(t *testing.T, cfg xds.Config) *mesh {
	t.Helper()
	testenv.Need(t, env)
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gatewayclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	x := index.New(ambient.Config{})
	if cfg.Mesh == nil {
		cfg.Mesh = x
	}
	m := newMesh(t, cfg, x)
	m.index = x
	w := kubeinput.New(kubeinput.Clients{Kube: env.Client, Istio: istio, Gateway: gw}, x, m.server.Changed, slog.New(slog.DiscardHandler))
	m.run(t, w.Synced(), func(ctx context.Context) { _ = w.Run(ctx) })
	return m
}

// newMesh builds an xDS server over source, authenticating with the API
// server, for proxies of a fresh namespace (also the system namespace).
func newMesh(t *testing.T, cfg xds.Config, source xds.Source) *mesh {
	t.Helper()
	testenv.Need(t, env) // the authenticator asks the API server
	auth, err := authn.New(authn.Config{LocalCluster: "Kubernetes",
		Clusters: map[string]authn.TokenReviewer{"Kubernetes": authn.Reviewer{Client: env.Client.AuthenticationV1()}}})
	if err != nil {
		t.Fatal(err)
	}
	return newMeshWithAuth(t, cfg, source, auth)
}

// newMeshWithAuth is newMesh with the caller's authenticator.
func newMeshWithAuth(t *testing.T, cfg xds.Config, source xds.Source, auth xds.Authenticator) *mesh {
	t.Helper()
	var err error
	m := &mesh{reg: prometheus.NewRegistry(), ns: env.Namespace(t, "proxies", nil)}
	cfg.Registerer, cfg.SystemNamespace = m.reg, m.ns
	if cfg.SendBudget == nil {
		cfg.SendBudget = xds.NewSendBudget(0)
	}
	m.budget = cfg.SendBudget
	if cfg.Quiet == 0 {
		cfg.Quiet, cfg.MaxDelay = 10*time.Millisecond, 50*time.Millisecond
	}
	if m.server, err = xds.New(cfg, source, auth, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return m
}

// run serves the mesh on a loopback port until the test ends, loading
// the tables once synced is closed; with runs alongside (the informers).
func (m *mesh) run(t *testing.T, synced <-chan struct{}, with ...func(context.Context)) {
	t.Helper()
	// As the controller serves: the budget learns from its codec when a
	// response is written.
	g := grpc.NewServer(grpc.ForceServerCodecV2(m.budget.Codec()))
	m.server.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, f := range with {
		wg.Go(func() { f(ctx) })
	}
	wg.Go(func() { _ = m.server.Run(ctx, synced) })
	wg.Go(func() { _ = g.Serve(lis) })
	t.Cleanup(func() {
		cancel()
		g.Stop()
		wg.Wait()
	})
}

func (m *mesh) token(t testing.TB) string {
	t.Helper()
	tok, err := env.Token(t.Context(), m.ns, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (m *mesh) node(t testing.TB, pod, nodeName string) *corev3.Node {
	t.Helper()
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": m.ns, "NAME": pod, "NODE_NAME": nodeName, "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "test"})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: fmt.Sprintf("ztunnel~10.0.0.1~%s.%s~%s.svc.cluster.local", pod, m.ns, m.ns), Metadata: md}
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// proxy is a connected xdsclient with its table.
type proxy struct {
	client *xdsclient.Client
	table  *workloadtable.Table
	stop   func()
}

// run runs the client until stop; run again after stop is a reconnect
// that keeps what the client holds.
func (p *proxy) run(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.client.Run(ctx) }()
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(p.stop)
}

type proxyOptions struct {
	onDemand bool
	handler  xdsclient.Handler
	onACK    func(typeURL, nonce string, rejected []workloadtable.Rejection)
	conn     *grpc.ClientConn
}

func (m *mesh) connect(t testing.TB, pod, nodeName string, o proxyOptions) *proxy {
	t.Helper()
	p := &proxy{table: workloadtable.New()}
	if o.handler == nil {
		o.handler = p.table
	}
	if o.conn == nil {
		o.conn = dial(t, m.addr)
	}
	tok := m.token(t)
	c, err := xdsclient.New(xdsclient.Config{
		Conn: o.conn, Node: m.node(t, pod, nodeName), ClusterID: "Kubernetes", OnDemand: o.onDemand,
		Token:   func(context.Context) (string, error) { return tok, nil },
		Handler: o.handler, OnACK: o.onACK, InitialBackoff: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	p.client = c
	p.run(t)
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("proxy not ready: no ACK of both types")
	}
	return p
}

// ambientPod creates a running, captured pod with an IP on a node.
func ambientPod(t testing.TB, ns, name, node, ip string, lbls map[string]string) string {
	t.Helper()
	ctx := t.Context()
	_, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls, Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setPodIP(t, ns, name, ip)
	return workloadapi.PodUID("Kubernetes", ns, name)
}

func setPodIP(t testing.TB, ns, name, ip string) {
	t.Helper()
	status, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}})
	if _, err := env.Client.CoreV1().Pods(ns).Patch(t.Context(), name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

func deletePod(t testing.TB, ns, name string) {
	t.Helper()
	zero := int64(0)
	if err := env.Client.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// TestPodLifecycle: a wildcard proxy sees a pod appear, change and go.
func TestPodLifecycle(t *testing.T) {
	m := startMesh(t, xds.Config{})
	p := m.connect(t, "ztunnel-1", "node-1", proxyOptions{})
	ns := env.Namespace(t, "apps", nil)

	uid := ambientPod(t, ns, "echo", "node-1", "10.244.1.20", map[string]string{"app": "echo"})
	eventually.Within(t, settle, "pod appears", func() bool { return p.table.Workload(uid).GetNode() == "node-1" })

	setPodIP(t, ns, "echo", "10.244.1.21")
	eventually.Within(t, settle, "pod changes", func() bool { return p.table.Has("/10.244.1.21") && !p.table.Has("/10.244.1.20") })

	deletePod(t, ns, "echo")
	eventually.Within(t, settle, "pod goes", func() bool { return p.table.Workload(uid) == nil })

	// The server's view agrees: the proxy is synced on both types.
	eventually.Within(t, settle, "proxy status synced", func() bool {
		for _, ps := range m.server.Status() {
			if ps.ProxyID == "ztunnel-1."+m.ns {
				return len(ps.Types) == 2 && ps.Types[0].Status == xds.Synced && ps.Types[1].Status == xds.Synced
			}
		}
		return false
	})
}

// TestOnDemandLookup: a lookup by IP returns the workload under its UID
// with the IP as alias; an unknown IP comes back as a removal; the
// proxy's own node's workloads arrive unasked.
func TestOnDemandLookup(t *testing.T) {
	m := startMesh(t, xds.Config{})
	ns := env.Namespace(t, "apps", nil)
	// The pod informer delivers in order: once local arrives, remote is in
	// the server's table too.
	remote := ambientPod(t, ns, "remote", "node-other", "10.244.8.10", nil)
	local := ambientPod(t, ns, "local", "node-od", "10.244.7.10", nil)

	var mu sync.Mutex
	var aliases []string
	rec := handlerFunc(func(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
		mu.Lock()
		for _, r := range rs {
			if r.GetName() == remote {
				aliases = append(aliases, r.GetAliases()...)
			}
		}
		mu.Unlock()
		return nil
	})
	p := &proxy{table: workloadtable.New()}
	both := handlerFunc(func(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
		rec(typeURL, rs, removed)
		return p.table.Apply(typeURL, rs, removed)
	})
	c := m.connect(t, "ztunnel-od", "node-od", proxyOptions{onDemand: true, handler: both})
	eventually.Within(t, settle, "own node's workload arrives unasked", func() bool { return p.table.Workload(local) != nil })
	if p.table.Workload(remote) != nil {
		t.Fatal("a workload of another node was sent to an on-demand proxy without a lookup")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	found, err := c.client.Lookup(ctx, "/10.244.8.10")
	if err != nil || !found {
		t.Fatalf("Lookup(/10.244.8.10) = %v, %v; want found", found, err)
	}
	if p.table.Workload(remote) == nil {
		t.Error("looked-up workload not in the table under its UID")
	}
	mu.Lock()
	if !slices.Contains(aliases, "/10.244.8.10") {
		t.Errorf("aliases = %q, want /10.244.8.10", aliases)
	}
	mu.Unlock()

	found, err = c.client.Lookup(ctx, "/10.250.0.1")
	if err != nil || found {
		t.Fatalf("Lookup(unknown) = %v, %v; want not found", found, err)
	}
}

type handlerFunc func(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection

func (f handlerFunc) Apply(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
	return f(typeURL, rs, removed)
}

func mustCounter(t testing.TB, m *mesh, name string) prometheus.Collector {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mm := range mf.GetMetric() {
			sum += mm.GetCounter().GetValue()
		}
	}
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name}, func() float64 { return sum })
}
