package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	networkingapi "istio.io/api/networking/v1alpha3"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/internal/testing/canopy"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// The restart fixture: pods spread over namespaces and services, each
// service selecting podsPerService of them.
const (
	restartNamespaces = 2
	restartServices   = 20 // per namespace
	podsPerService    = 10
	// quiet is how long the client must have been sent nothing of the
	// fixture's before its view counts as settled.
	quiet = 2 * time.Second
)

// TestRestartWithoutFlap attacks a controller's start and restart with a
// node proxy that is already connecting when it comes up, over a few
// hundred pods, services, policies and entries:
//
//   - fresh start: the proxy's first response of each type holds every
//     resource of the fixture; nothing of it arrives later (a partial
//     table and then the rest would make every proxy briefly forget
//     part of the mesh);
//   - restart: a new controller process, same API server, the proxy
//     reconnecting with initial_resource_versions for all it holds: it is
//     told to remove nothing, sent no resource (none changed), and at no
//     point lacks one.
func TestRestartWithoutFlap(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	bin, err := canopy.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fx := writeRestartFixture(t)
	sys := env.Namespace(t, "canopy-system", nil)
	plain := freeAddr(t)
	// start runs a controller on the proxy's address. slowAPI paces its
	// API client (as listing 10k pods would take long): the proxy's
	// stream surely opens before the informers are synced. Unpaced, the
	// informers list at once and their handlers lag furthest behind
	// their caches.
	start := func(id string, slowAPI bool) *canopy.Controller {
		t.Helper()
		args := []string{"--xds-addr=" + plain, "--push-quiet=20ms", "--push-max-delay=200ms"}
		if slowAPI {
			args = append(args, "--kube-api-qps=20", "--kube-api-burst=1")
		}
		return startController(t, bin, sys, id, args...)
	}

	// The proxy dials before any controller listens, and retries quickly:
	// its stream opens while the controller is still listing.
	v := newView(fx.ours)
	runProxy(t, sys, dialFast(t, plain), v)

	cur := start("controller-1", false)
	eventually.Within(t, settle, "proxy holds the fixture and is sent nothing more", func() bool {
		return v.holds(fx.names) && v.quietFor(quiet)
	})
	connectedEarly(t, cur, false)
	held := v.snapshot()
	t.Logf("the proxy holds %d addresses and %d authorizations of the fixture",
		len(held[workloadapi.AddressTypeURL]), len(held[workloadapi.AuthorizationTypeURL]))

	t.Run("first response is complete", func(t *testing.T) {
		for _, typ := range []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL} {
			events := v.eventsOf(typ)
			if len(events) == 0 {
				t.Fatalf("%s: no response", shortType(typ))
			}
			firstResp := events[0]
			var late []string
			for name := range held[typ] {
				if _, ok := firstResp.resources[name]; !ok {
					late = append(late, name)
				}
			}
			slices.Sort(late)
			if len(late) > 0 {
				t.Errorf("%s: the first response held %d of the fixture's %d resources; %d came later, e.g. %q",
					shortType(typ), len(firstResp.resources), len(held[typ]), len(late), late[:min(5, len(late))])
			}
			for _, e := range events {
				if len(e.removed) > 0 {
					t.Errorf("%s: told to remove %q on a fresh start", shortType(typ), e.removed[:min(5, len(e.removed))])
				}
			}
		}
	})

	for i, slowAPI := range []bool{true, false} {
		name := "reconnect after restart changes nothing"
		if slowAPI {
			name += " (slow API client)"
		}
		t.Run(name, func(t *testing.T) {
			mark := v.restart(held)
			if err := cur.Stop(); err != nil {
				t.Logf("stop the controller: %v", err)
			}
			cur = start(fmt.Sprintf("controller-%d", i+2), slowAPI)
			eventually.Within(t, settle, "proxy answered by the new controller and sent nothing more", func() bool {
				return v.answeredSince(mark) && v.quietFor(quiet)
			})
			connectedEarly(t, cur, slowAPI)
			removed, changed, resent, gaps := v.since(mark)
			t.Logf("after the restart: %d removed, %d changed, %d resent unchanged, %d gaps", len(removed), len(changed), len(resent), len(gaps))
			for _, c := range []struct {
				what  string
				names []string
			}{{"removed", removed}, {"changed", changed}, {"resent unchanged", resent}, {"missing at some point", gaps}} {
				if len(c.names) > 0 {
					t.Errorf("%d of the fixture's resources %s after the restart, e.g. %q", len(c.names), c.what, c.names[:min(5, len(c.names))])
				}
			}
		})
	}
}

// startController runs the built controller with its CA in namespace sys
// and more flags; the test's end stops it, and a failed test logs the
// tail of its log.
func startController(t *testing.T, bin, sys, id string, args ...string) *canopy.Controller {
	t.Helper()
	c, err := canopy.Start(canopy.Options{Binary: bin, Kubeconfig: env.KubeconfigPath, CANamespace: sys, Dir: t.TempDir(), ID: id, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(c.LogPath)
			t.Logf("%s log (tail):\n%s", id, tail(string(b), 4000))
		}
	})
	return c
}

// dialFast connects to plaintext xDS at target, retrying every 10 to
// 100 ms, as a proxy waiting for its controller would (only faster).
func dialFast(t *testing.T, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second})},
		opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// runProxy runs a node proxy's Delta xDS client (wildcard subscriptions
// to addresses and authorizations, as ztunnel's) over conn until the test
// ends, applying every response to v. On a reconnect it sends
// initial_resource_versions for all it holds.
func runProxy(t *testing.T, sys string, conn *grpc.ClientConn, v *view) {
	t.Helper()
	token, err := env.Token(t.Context(), sys, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": sys, "NODE_NAME": "node-1", "CLUSTER_ID": "Kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	client, err := xdsclient.New(xdsclient.Config{
		Conn: conn, Node: &corev3.Node{Id: "ztunnel~10.0.0.1~ztunnel-r." + sys + "~" + sys + ".svc.cluster.local", Metadata: md},
		Token: func(context.Context) (string, error) { return token, nil }, ClusterID: "Kubernetes", Handler: v,
		InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = client.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// connectedEarly checks the premise of the attack: the proxy's stream
// was open before the controller had loaded its tables (its log says
// so). Only a paced controller (strict) is sure to be attacked so; of
// the others it is logged.
func connectedEarly(t *testing.T, c *canopy.Controller, strict bool) {
	t.Helper()
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	connected, loaded := -1, -1
	for i, line := range strings.Split(string(b), "\n") {
		var entry struct{ Msg string }
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		switch {
		case entry.Msg == "proxy connected" && connected < 0:
			connected = i
		case entry.Msg == "workload xDS tables loaded" && loaded < 0:
			loaded = i
		}
	}
	switch early := connected >= 0 && loaded >= 0 && connected < loaded; {
	case !early && strict:
		t.Errorf("the proxy connected at log line %d, the tables loaded at %d: the stream did not open before the tables loaded, so nothing was attacked", connected, loaded)
	case !early:
		t.Logf("the proxy connected after the tables loaded (log lines %d, %d)", connected, loaded)
	default:
		t.Logf("the proxy connected before the tables loaded (log lines %d, %d)", connected, loaded)
	}
}

// restartFixture is what writeRestartFixture made: the names a node
// proxy must hold, and which names are the fixture's.
type restartFixture struct {
	names map[string][]string // by type URL
	ours  func(name string) bool
}

// writeRestartFixture writes, before any controller runs, the pods
// (running, with IPs and Ready, in an ambient namespace), services,
// EndpointSlices settled by the API server's controller, an
// AuthorizationPolicy per service, a namespace STRICT PeerAuthentication,
// ServiceEntries (one with addresses, one left to VIP allocation) and a
// WorkloadEntry.
func writeRestartFixture(t *testing.T) restartFixture {
	t.Helper()
	ctx := t.Context()
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The EndpointSlice controller leaves out pods of nodes it does not
	// know.
	node, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "flap-node-",
		Labels: map[string]string{corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: "zone-a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := env.Client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete node %s: %v", node.Name, err)
		}
	})
	var nss []string
	for range restartNamespaces {
		nss = append(nss, env.Namespace(t, "flap", map[string]string{"istio.io/dataplane-mode": "ambient"}))
	}
	fx := restartFixture{names: map[string][]string{}, ours: func(name string) bool {
		for _, ns := range nss {
			if strings.HasPrefix(name, ns+"/") || strings.Contains(name, "/"+ns+"/") {
				return true
			}
		}
		return false
	}}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for n, ns := range nss {
		for s := range restartServices {
			app := fmt.Sprintf("app-%d", s)
			g.Go(func() error {
				_, err := env.Client.CoreV1().Services(ns).Create(gctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: app},
					Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
						Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
				}, metav1.CreateOptions{})
				return err
			})
			g.Go(func() error {
				pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-" + app}}
				pol.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": app}}
				pol.Spec.Rules = []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{ns}}}}}}
				_, err := istio.SecurityV1().AuthorizationPolicies(ns).Create(gctx, pol, metav1.CreateOptions{})
				return err
			})
			fx.names[workloadapi.AddressTypeURL] = append(fx.names[workloadapi.AddressTypeURL], workloadapi.ServiceKey(ns, app+"."+ns+".svc.cluster.local"))
			fx.names[workloadapi.AuthorizationTypeURL] = append(fx.names[workloadapi.AuthorizationTypeURL], ns+"/allow-"+app)
			for p := range podsPerService {
				name := fmt.Sprintf("%s-%d", app, p)
				ip := fmt.Sprintf("10.250.%d.%d", n*restartServices+s, 10+p)
				fx.names[workloadapi.AddressTypeURL] = append(fx.names[workloadapi.AddressTypeURL], workloadapi.PodUID("Kubernetes", ns, name))
				g.Go(func() error { return createRunningPod(gctx, ns, name, node.Name, app, ip) })
			}
		}
		g.Go(func() error {
			pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "strict"}}
			pa.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}
			_, err := istio.SecurityV1().PeerAuthentications(ns).Create(gctx, pa, metav1.CreateOptions{})
			return err
		})
		for i, addrs := range [][]string{{fmt.Sprintf("240.240.%d.1", n)}, nil} {
			host := fmt.Sprintf("ext-%d.%s.example.com", i, ns)
			fx.names[workloadapi.AddressTypeURL] = append(fx.names[workloadapi.AddressTypeURL], workloadapi.ServiceKey(ns, host))
			g.Go(func() error {
				se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ext-%d", i)}}
				se.Spec.Hosts = []string{host}
				se.Spec.Addresses = addrs
				se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}}
				se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
				se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "vm"}}
				_, err := istio.NetworkingV1().ServiceEntries(ns).Create(gctx, se, metav1.CreateOptions{})
				return err
			})
		}
		fx.names[workloadapi.AddressTypeURL] = append(fx.names[workloadapi.AddressTypeURL], workloadapi.WorkloadEntryUID("Kubernetes", ns, "vm"))
		g.Go(func() error {
			we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm", Labels: map[string]string{"app": "vm"}}}
			we.Spec.Address = fmt.Sprintf("10.251.%d.1", n)
			_, err := istio.NetworkingV1().WorkloadEntries(ns).Create(gctx, we, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("write the fixture: %v", err)
	}
	// The EndpointSlice controller has caught up: a controller starting
	// now lists the cluster as it stays.
	eventually.Within(t, settle, "EndpointSlices hold every pod", func() bool {
		for _, ns := range nss {
			slices, err := env.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			ready := map[string]int{}
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready[s.Labels[discoveryv1.LabelServiceName]]++
					}
				}
			}
			for s := range restartServices {
				if ready[fmt.Sprintf("app-%d", s)] != podsPerService {
					return false
				}
			}
		}
		return true
	})
	return fx
}

// createRunningPod creates a pod with an IP, running and Ready, as a
// kubelet would report it.
func createRunningPod(ctx context.Context, ns, name, node, app, ip string) error {
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app},
			Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	st, err := json.Marshal(map[string]any{"status": corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}})
	if err != nil {
		return err
	}
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, st, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("set status of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// event is one response, as far as the fixture's resources go.
type event struct {
	typ       string
	resources map[string]string // name: version
	removed   []string
	at        time.Time
	// missing are the names held before the restart that the view lacked
	// once this response was applied.
	missing []string
}

// view is a node proxy's tables as names and versions, checked after every
// response: an xdsclient.Handler.
type view struct {
	ours func(string) bool

	mu     sync.Mutex
	held   map[string]map[string]string
	events []event
	last   time.Time
	// expect is what the proxy held before the restart; each response is
	// checked against it.
	expect map[string]map[string]string
}

func newView(ours func(string) bool) *view {
	return &view{ours: ours, held: map[string]map[string]string{}}
}

// Apply implements xdsclient.Handler.
func (v *view) Apply(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now()
	e := event{typ: typeURL, resources: map[string]string{}, at: now}
	h := v.held[typeURL]
	if h == nil {
		h = map[string]string{}
		v.held[typeURL] = h
	}
	for _, r := range rs {
		h[r.GetName()] = r.GetVersion()
		if v.ours(r.GetName()) {
			e.resources[r.GetName()] = r.GetVersion()
		}
	}
	for _, name := range removed {
		delete(h, name)
		if v.ours(name) {
			e.removed = append(e.removed, name)
		}
	}
	for name := range v.expect[typeURL] {
		if _, ok := h[name]; !ok {
			e.missing = append(e.missing, name)
		}
	}
	if len(e.resources) > 0 || len(e.removed) > 0 {
		v.last = now
	}
	v.events = append(v.events, e)
	return nil
}

// holds reports whether the view has every name listed.
func (v *view) holds(names map[string][]string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for typ, ns := range names {
		for _, n := range ns {
			if _, ok := v.held[typ][n]; !ok {
				return false
			}
		}
	}
	return true
}

// quietFor reports whether nothing of the fixture's has been sent for d.
func (v *view) quietFor(d time.Duration) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return !v.last.IsZero() && time.Since(v.last) >= d
}

// snapshot is the fixture's part of the view, by type.
func (v *view) snapshot() map[string]map[string]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]map[string]string{}
	for typ, h := range v.held {
		out[typ] = map[string]string{}
		for n, ver := range h {
			if v.ours(n) {
				out[typ][n] = ver
			}
		}
	}
	return out
}

func (v *view) eventsOf(typ string) []event {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []event
	for _, e := range v.events {
		if e.typ == typ {
			out = append(out, e)
		}
	}
	return out
}

// restart starts checking every response against expect and returns the
// index of the first response after it.
func (v *view) restart(expect map[string]map[string]string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.expect = expect
	return len(v.events)
}

// answeredSince reports whether both types have had a response since mark.
func (v *view) answeredSince(mark int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	seen := map[string]bool{}
	for _, e := range v.events[mark:] {
		seen[e.typ] = true
	}
	return seen[workloadapi.AddressTypeURL] && seen[workloadapi.AuthorizationTypeURL]
}

// since sorts what the responses after mark did to the fixture's
// resources held at the restart: removed, sent at another version, sent
// again at the same version, and missing after some response.
func (v *view) since(mark int) (removed, changed, resent, gaps []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	set := func(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }
	rm, ch, rs, gp := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, e := range v.events[mark:] {
		for _, n := range e.removed {
			rm[n] = true
		}
		for n, ver := range e.resources {
			if old, ok := v.expect[e.typ][n]; ok && old == ver {
				rs[n] = true
			} else {
				ch[n] = true
			}
		}
		for _, n := range e.missing {
			gp[n] = true
		}
	}
	return set(rm), set(ch), set(rs), set(gp)
}

func shortType(typ string) string { return typ[strings.LastIndex(typ, ".")+1:] }

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
