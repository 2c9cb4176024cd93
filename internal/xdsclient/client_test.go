package xdsclient_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// The proxy the tests connect as: ztunnel-a in istio-system on node-a.
const (
	proxyNS   = "istio-system"
	proxyNode = "node-a"
	cluster   = "Kubernetes"
	token     = "test-token"
)

// Resources of the tables the control plane serves.
var (
	localUID  = workloadapi.PodUID(cluster, "apps", "echo-local")
	remoteUID = workloadapi.PodUID(cluster, "apps", "echo-remote")
	echoKey   = workloadapi.ServiceKey("apps", "echo.apps.svc.cluster.local")
)

func workload(uid, name, node, ip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Name: name, Namespace: "apps", Node: node, Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()},
		Services: map[string]*workloadapi.PortList{echoKey: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}},
	}}}
}

func service(vip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: "echo", Namespace: "apps", Hostname: "echo.apps.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}}}
}

func policy(name string, action security.Action) *security.Authorization {
	return &security.Authorization{Name: name, Namespace: "apps", Scope: security.Scope_NAMESPACE, Action: action}
}

// source is an in-memory table for the controller's xDS server. Changes
// made through its put and remove methods tell the server, as the
// informers would.
type source struct {
	mu     sync.Mutex
	addrs  map[string]*workloadapi.Address
	authz  map[string]*security.Authorization
	server *xds.Server
}

func newSource() *source {
	return &source{addrs: map[string]*workloadapi.Address{}, authz: map[string]*security.Authorization{}}
}

// Address implements xds.Source.
func (s *source) Address(name string) *workloadapi.Address {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[name]
}

// Authorization implements xds.Source.
func (s *source) Authorization(name string) *security.Authorization {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authz[name]
}

// AddressNames implements xds.Source.
func (s *source) AddressNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.addrs))
}

// AuthorizationNames implements xds.Source.
func (s *source) AuthorizationNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.authz))
}

// putAddress stores a under its name and tells the server.
func (s *source) putAddress(a *workloadapi.Address) {
	name := workloadapi.ResourceName(a)
	s.mu.Lock()
	s.addrs[name] = a
	srv := s.server
	s.mu.Unlock()
	if srv != nil {
		srv.Changed(index.ChangeSet{Addresses: index.Changes{Updated: []string{name}}})
	}
}

// putPolicy stores p under its name and tells the server.
func (s *source) putPolicy(p *security.Authorization) {
	name := security.ResourceName(p)
	s.mu.Lock()
	s.authz[name] = p
	srv := s.server
	s.mu.Unlock()
	if srv != nil {
		srv.Changed(index.ChangeSet{Authorizations: index.Changes{Updated: []string{name}}})
	}
}

// removeAddress removes name and tells the server.
func (s *source) removeAddress(name string) {
	s.mu.Lock()
	delete(s.addrs, name)
	srv := s.server
	s.mu.Unlock()
	if srv != nil {
		srv.Changed(index.ChangeSet{Addresses: index.Changes{Removed: []string{name}}})
	}
}

// authenticator accepts every stream as the proxies' service account and
// records the token and cluster each stream presented.
type authenticator struct {
	mu    sync.Mutex
	calls [][2]string
}

// Authenticate implements xds.Authenticator.
func (a *authenticator) Authenticate(_ context.Context, tok, clusterID string) (authn.Caller, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, [2]string{tok, clusterID})
	return authn.Caller{Cluster: cluster, Namespace: proxyNS, ServiceAccount: "ztunnel"}, nil
}

func (a *authenticator) seen() [][2]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// wire records what crosses each stream, as the server sees it.
type wire struct {
	mu      sync.Mutex
	streams []*streamLog
	// holdKey: a request subscribing to it is taken in but never reaches
	// the server; holding is closed when one arrives.
	holdKey string
	holding chan struct{}
}

// hold makes the server never see a lookup of key; the returned channel
// is closed once the client has sent it.
func (w *wire) hold(key string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holdKey, w.holding = key, make(chan struct{})
	return w.holding
}

type streamLog struct {
	reqs  []*discoveryv3.DeltaDiscoveryRequest
	resps []*discoveryv3.DeltaDiscoveryResponse
}

func (w *wire) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	w.mu.Lock()
	l := &streamLog{}
	w.streams = append(w.streams, l)
	w.mu.Unlock()
	return handler(srv, &recordedStream{ServerStream: ss, w: w, log: l})
}

// stream returns a copy of stream i's log, or an empty one.
func (w *wire) stream(i int) streamLog {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i >= len(w.streams) {
		return streamLog{}
	}
	return streamLog{reqs: slices.Clone(w.streams[i].reqs), resps: slices.Clone(w.streams[i].resps)}
}

type recordedStream struct {
	grpc.ServerStream
	w   *wire
	log *streamLog
}

func (s *recordedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	req, ok := m.(*discoveryv3.DeltaDiscoveryRequest)
	if !ok || err != nil {
		return err
	}
	s.w.mu.Lock()
	s.log.reqs = append(s.log.reqs, proto.CloneOf(req))
	held := s.w.holdKey != "" && slices.Contains(req.GetResourceNamesSubscribe(), s.w.holdKey)
	if held {
		close(s.w.holding)
		s.w.holdKey = ""
	}
	s.w.mu.Unlock()
	if held {
		<-s.Context().Done()
		return s.Context().Err()
	}
	return nil
}

func (s *recordedStream) SendMsg(m any) error {
	if resp, ok := m.(*discoveryv3.DeltaDiscoveryResponse); ok {
		s.w.mu.Lock()
		s.log.resps = append(s.log.resps, proto.CloneOf(resp))
		s.w.mu.Unlock()
	}
	return s.ServerStream.SendMsg(m)
}

// controlPlane is the controller's xDS server over a source, on loopback.
type controlPlane struct {
	addr   string
	server *xds.Server
	auth   *authenticator
	wire   *wire
	stop   func()
}

// startControlPlane serves src on addr ("127.0.0.1:0" for a free port)
// until stop or the end of the test. A new control plane on the address of
// a stopped one is a controller restart: fresh state, same tables.
func startControlPlane(t *testing.T, src *source, addr string) *controlPlane {
	t.Helper()
	cp := &controlPlane{auth: &authenticator{}, wire: &wire{}}
	srv, err := xds.New(xds.Config{Quiet: time.Millisecond, MaxDelay: 5 * time.Millisecond}, src, cp.auth, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cp.server = srv
	src.mu.Lock()
	src.server = srv
	src.mu.Unlock()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = lis.Addr().String()
	g := grpc.NewServer(grpc.StreamInterceptor(cp.wire.intercept))
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan struct{})
	close(synced)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Run(ctx, synced) })
	wg.Go(func() { _ = g.Serve(lis) })
	var once sync.Once
	cp.stop = func() {
		once.Do(func() {
			cancel()
			g.Stop()
			wg.Wait()
		})
	}
	t.Cleanup(cp.stop)
	return cp
}

func node(t *testing.T) *corev3.Node {
	t.Helper()
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": proxyNS, "NAME": "ztunnel-a", "NODE_NAME": proxyNode, "CLUSTER_ID": cluster})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: "ztunnel~10.0.0.1~ztunnel-a." + proxyNS + "~" + proxyNS + ".svc.cluster.local", Metadata: md}
}

// ack is one OnACK call.
type ack struct {
	typeURL, nonce string
	rejected       []workloadtable.Rejection
}

// proxy is an xdsclient feeding a workloadtable, as in the node proxy.
type proxy struct {
	client *xdsclient.Client
	table  *workloadtable.Table
	node   *corev3.Node

	mu   sync.Mutex
	acks []ack
}

type options struct {
	onDemand bool
}

// newProxy dials addr; the client is not running until run.
func newProxy(t *testing.T, addr string, o options) *proxy {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	p := &proxy{table: workloadtable.New(), node: node(t)}
	p.client, err = xdsclient.New(xdsclient.Config{
		Conn: cc, Node: p.node, ClusterID: cluster, OnDemand: o.onDemand, Handler: p.table,
		Token:          func(context.Context) (string, error) { return token, nil },
		InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		OnACK: func(typeURL, nonce string, rejected []workloadtable.Rejection) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.acks = append(p.acks, ack{typeURL, nonce, rejected})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs the client until the returned stop or the end of the test.
func (p *proxy) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.client.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() = %v after its context ended, want nil", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (p *proxy) ready(t *testing.T) {
	t.Helper()
	select {
	case <-p.client.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("client not ready: no ACK of both types")
	}
}

func (p *proxy) acked() []ack {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acks)
}

// eventually polls f until it holds, failing the test after 10s.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !f() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting until %s", what)
		case <-tick.C:
		}
	}
}

// responses counts the responses sent on every stream.
func (w *wire) responses() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.streams {
		n += len(l.resps)
	}
	return n
}

// settled waits until the client has applied and acknowledged every
// response the control planes sent: OnACK runs after both, so what the
// client holds is then what was sent.
func (p *proxy) settled(t *testing.T, cps ...*controlPlane) {
	t.Helper()
	eventually(t, "every response applied and ACKed", func() bool {
		n := 0
		for _, cp := range cps {
			n += cp.wire.responses()
		}
		return len(p.acked()) >= n
	})
}

// firstRequests returns the first request of each type on stream i, in
// the order sent, waiting for both.
func firstRequests(t *testing.T, w *wire, i int) []*discoveryv3.DeltaDiscoveryRequest {
	t.Helper()
	var out []*discoveryv3.DeltaDiscoveryRequest
	eventually(t, "both first requests arrive", func() bool {
		out = nil
		seen := map[string]bool{}
		for _, r := range w.stream(i).reqs {
			if !seen[r.GetTypeUrl()] {
				seen[r.GetTypeUrl()] = true
				out = append(out, r)
			}
		}
		return len(out) == 2
	})
	return out
}

// versions returns what the server's responses on a stream left the
// client holding of a type, by name, applying them in order.
func versions(l streamLog, typeURL string, held map[string]string) map[string]string {
	out := maps.Clone(held)
	if out == nil {
		out = map[string]string{}
	}
	for _, r := range l.resps {
		if r.GetTypeUrl() != typeURL {
			continue
		}
		for _, res := range r.GetResources() {
			out[res.GetName()] = res.GetVersion()
		}
		for _, name := range r.GetRemovedResources() {
			delete(out, name)
		}
	}
	return out
}

func TestNewRequiresConnNodeHandler(t *testing.T) {
	t.Parallel()
	cc, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	n := &corev3.Node{Id: "ztunnel~10.0.0.1~a.b~b.svc.cluster.local"}
	h := workloadtable.New()
	for _, tt := range []struct {
		name    string
		cfg     xdsclient.Config
		wantErr bool
	}{
		{"complete", xdsclient.Config{Conn: cc, Node: n, Handler: h}, false},
		{"no conn", xdsclient.Config{Node: n, Handler: h}, true},
		{"no node", xdsclient.Config{Conn: cc, Handler: h}, true},
		{"no handler", xdsclient.Config{Conn: cc, Node: n}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := xdsclient.New(tt.cfg)
			if (err != nil) != tt.wantErr {
				t.Errorf("New() error = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

// TestInitialRequests: a stream opens with the node on one request per
// type, Address first, wildcard or "nothing yet" as configured, with the
// token and cluster as metadata.
func TestInitialRequests(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name                   string
		onDemand               bool
		subscribe, unsubscribe []string
	}{
		{name: "wildcard"},
		{name: "on demand", onDemand: true, subscribe: []string{"*"}, unsubscribe: []string{"*"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cp := startControlPlane(t, newSource(), "127.0.0.1:0")
			p := newProxy(t, cp.addr, options{onDemand: tt.onDemand})
			p.run(t)
			p.ready(t)

			want := []*discoveryv3.DeltaDiscoveryRequest{
				{Node: p.node, TypeUrl: workloadapi.AddressTypeURL, ResourceNamesSubscribe: tt.subscribe, ResourceNamesUnsubscribe: tt.unsubscribe},
				{Node: p.node, TypeUrl: workloadapi.AuthorizationTypeURL},
			}
			if diff := cmp.Diff(want, firstRequests(t, cp.wire, 0), protocmp.Transform()); diff != "" {
				t.Errorf("first requests mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([][2]string{{token, cluster}}, cp.auth.seen()); diff != "" {
				t.Errorf("token and cluster presented (-want +got):\n%s", diff)
			}
		})
	}
}

// TestApplyAndACK: a wildcard client applies adds, updates and removals to
// its handler, holds the versions sent, and ACKs every response by nonce.
func TestApplyAndACK(t *testing.T) {
	t.Parallel()
	src := newSource()
	src.putAddress(workload(localUID, "echo-local", proxyNode, "10.244.1.10"))
	src.putAddress(workload(remoteUID, "echo-remote", "node-b", "10.244.2.20"))
	src.putAddress(service("10.96.0.10"))
	src.putPolicy(policy("allow", security.Action_ALLOW))
	cp := startControlPlane(t, src, "127.0.0.1:0")
	p := newProxy(t, cp.addr, options{})
	p.run(t)
	p.ready(t)

	eventually(t, "the whole table arrives", func() bool {
		s := p.table.Snapshot()
		return len(s.Workloads) == 2 && len(s.Services) == 1 && len(s.Policies) == 1
	})

	src.removeAddress(remoteUID)
	src.putAddress(workload(localUID, "echo-local", proxyNode, "10.244.1.11"))
	src.putPolicy(policy("deny", security.Action_DENY))
	eventually(t, "the changes arrive", func() bool {
		return p.table.Workload(remoteUID) == nil && p.table.Has("/10.244.1.11") && !p.table.Has("/10.244.1.10") && p.table.Policy("apps/deny") != nil
	})
	if p.table.Service(echoKey) == nil {
		t.Error("service lost")
	}

	p.settled(t, cp)
	l := cp.wire.stream(0)
	for _, typ := range []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL} {
		if diff := cmp.Diff(versions(l, typ, nil), p.client.Versions(typ)); diff != "" {
			t.Errorf("Versions(%s) is not what was sent (-sent +held):\n%s", typ, diff)
		}
	}
	if _, held := p.client.Versions(workloadapi.AddressTypeURL)[remoteUID]; held {
		t.Error("a removed workload is still held")
	}
	// Every response is ACKed on the wire and to OnACK, by type and nonce.
	var wantACKs, gotACKs []ack
	eventually(t, "every response ACKed", func() bool {
		l := cp.wire.stream(0)
		wantACKs, gotACKs = nil, nil
		for _, r := range l.resps {
			wantACKs = append(wantACKs, ack{typeURL: r.GetTypeUrl(), nonce: r.GetNonce()})
		}
		for _, r := range l.reqs {
			if r.GetResponseNonce() != "" {
				gotACKs = append(gotACKs, ack{typeURL: r.GetTypeUrl(), nonce: r.GetResponseNonce()})
			}
		}
		return len(p.acked()) >= len(wantACKs) && len(gotACKs) >= len(wantACKs)
	})
	if diff := cmp.Diff(wantACKs, p.acked(), cmp.AllowUnexported(ack{})); diff != "" {
		t.Errorf("OnACK calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantACKs, gotACKs, cmp.AllowUnexported(ack{})); diff != "" {
		t.Errorf("ACKs on the wire (-want +got):\n%s", diff)
	}
	for _, r := range cp.wire.stream(0).reqs {
		if r.GetResponseNonce() != "" && (r.GetErrorDetail() != nil || r.GetNode() != nil || len(r.GetResourceNamesSubscribe()) > 0) {
			t.Errorf("ACK carries more than type and nonce: %v", r)
		}
	}
}

// TestNACKKeepsGoodState: a response with a resource that does not match
// its name is NACKed with INVALID_ARGUMENT naming it; the resources beside
// it are applied, and what was held of the rejected one stays, in the
// table and in the versions sent on reconnect.
func TestNACKKeepsGoodState(t *testing.T) {
	t.Parallel()
	src := newSource()
	src.putAddress(workload(localUID, "echo-local", proxyNode, "10.244.1.10"))
	cp := startControlPlane(t, src, "127.0.0.1:0")
	p := newProxy(t, cp.addr, options{})
	p.run(t)
	p.ready(t)
	eventually(t, "workload arrives", func() bool { return p.table.Workload(localUID) != nil })
	good := p.client.Versions(workloadapi.AddressTypeURL)[localUID]

	// One commit: the held workload now says it is another, and a new
	// service arrives beside it.
	src.mu.Lock()
	src.addrs[localUID] = workload(remoteUID, "echo-remote", proxyNode, "10.244.1.99")
	src.addrs[echoKey] = service("10.96.0.10")
	src.mu.Unlock()
	cp.server.Changed(index.ChangeSet{Addresses: index.Changes{Updated: []string{localUID, echoKey}}})

	var nack ack
	eventually(t, "a NACK", func() bool {
		for _, a := range p.acked() {
			if len(a.rejected) > 0 {
				nack = a
				return true
			}
		}
		return false
	})
	if nack.typeURL != workloadapi.AddressTypeURL || len(nack.rejected) != 1 || nack.rejected[0].Name != localUID {
		t.Errorf("OnACK rejected %v of %s, want only %s", nack.rejected, nack.typeURL, localUID)
	}
	var sent *discoveryv3.DeltaDiscoveryRequest
	eventually(t, "the NACK reaches the server", func() bool {
		for _, r := range cp.wire.stream(0).reqs {
			if r.GetResponseNonce() == nack.nonce {
				sent = r
			}
		}
		return sent != nil
	})
	wantMsg := localUID + `: address is named "` + remoteUID + `"`
	if sent.GetErrorDetail().GetCode() != 3 || sent.GetErrorDetail().GetMessage() != wantMsg || sent.GetTypeUrl() != workloadapi.AddressTypeURL {
		t.Errorf("NACK = %v, want type Address, code 3, message %q", sent, wantMsg)
	}
	if p.table.Service(echoKey) == nil {
		t.Error("the good resource of the NACKed response was not applied")
	}
	if w := p.table.Workload(localUID); !p.table.Has("/10.244.1.10") || w.GetName() != "echo-local" {
		t.Errorf("held workload = %v, want the last good one", w)
	}
	if got := p.client.Versions(workloadapi.AddressTypeURL)[localUID]; got != good {
		t.Errorf("held version of the rejected resource = %q, want the good %q", got, good)
	}
	// The server saw the NACK.
	eventually(t, "proxy status shows the NACK", func() bool {
		st := cp.server.Status()
		return len(st) == 1 && st[0].Types[0].NACK == wantMsg
	})
}

// TestOnDemand: an on-demand client gets its node's workloads unasked and
// nothing else; Lookup subscribes to a key and completes on the answer,
// found or not; a subscribed workload keeps being updated.
func TestOnDemand(t *testing.T) {
	t.Parallel()
	src := newSource()
	src.putAddress(workload(localUID, "echo-local", proxyNode, "10.244.1.10"))
	src.putAddress(workload(remoteUID, "echo-remote", "node-b", "10.244.2.20"))
	cp := startControlPlane(t, src, "127.0.0.1:0")
	p := newProxy(t, cp.addr, options{onDemand: true})
	p.run(t)
	p.ready(t)
	eventually(t, "own node's workload arrives unasked", func() bool { return p.table.Workload(localUID) != nil })
	if p.table.Workload(remoteUID) != nil {
		t.Fatal("another node's workload arrived without a lookup")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		key  string
		want bool
	}{
		{"/10.244.2.20", true}, // an alias: answered under the UID
		{remoteUID, true},      // held already: answered again
		{"/10.250.0.1", false},
		{"apps/nothing.apps.svc.cluster.local", false},
	} {
		found, err := p.client.Lookup(ctx, tt.key)
		if err != nil || found != tt.want {
			t.Errorf("Lookup(%q) = %v, %v; want %v", tt.key, found, err, tt.want)
		}
	}
	if p.table.Workload(remoteUID) == nil {
		t.Error("looked-up workload not in the table")
	}
	var subscribed []string
	for _, r := range cp.wire.stream(0).reqs {
		if r.GetNode() == nil && len(r.GetResourceNamesSubscribe()) > 0 {
			if r.GetTypeUrl() != workloadapi.AddressTypeURL || len(r.GetResourceNamesUnsubscribe()) > 0 || r.GetResponseNonce() != "" {
				t.Errorf("lookup request %v, want only the type and the key", r)
			}
			subscribed = append(subscribed, r.GetResourceNamesSubscribe()...)
		}
	}
	if diff := cmp.Diff([]string{"/10.244.2.20", remoteUID, "/10.250.0.1", "apps/nothing.apps.svc.cluster.local"}, subscribed); diff != "" {
		t.Errorf("subscribed keys (-want +got):\n%s", diff)
	}

	src.putAddress(workload(remoteUID, "echo-remote", "node-b", "10.244.2.21"))
	eventually(t, "looked-up workload updated", func() bool { return p.table.Has("/10.244.2.21") })
	src.removeAddress(remoteUID)
	eventually(t, "looked-up workload removed", func() bool { return p.table.Workload(remoteUID) == nil })
	p.settled(t, cp)
	if _, held := p.client.Versions(workloadapi.AddressTypeURL)[remoteUID]; held {
		t.Error("removed workload still held")
	}
}

// TestLookupOverReconnect: a lookup still unanswered when the stream
// ends goes out again on the next stream's first request, with an empty
// version, and completes there; a lookup abandoned before does not.
func TestLookupOverReconnect(t *testing.T) {
	t.Parallel()
	src := newSource()
	src.putAddress(workload(remoteUID, "echo-remote", "node-b", "10.244.2.20"))
	cp := startControlPlane(t, src, "127.0.0.1:0")
	// The first control plane takes the lookup in and never answers it.
	holding := cp.wire.hold("/10.244.2.20")
	p := newProxy(t, cp.addr, options{onDemand: true})

	abandoned, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.client.Lookup(abandoned, "/10.9.9.9"); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup(cancelled) error = %v, want context.Canceled", err)
	}
	p.run(t)
	p.ready(t)

	type result struct {
		found bool
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		found, err := p.client.Lookup(ctx, "/10.244.2.20")
		done <- result{found, err}
	}()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("lookup not sent")
	}
	cp.stop()
	restarted := startControlPlane(t, src, cp.addr)
	if r := <-done; !r.found || r.err != nil {
		t.Errorf("Lookup() = %v, %v; want found", r.found, r.err)
	}
	want := &discoveryv3.DeltaDiscoveryRequest{
		Node: p.node, TypeUrl: workloadapi.AddressTypeURL, ResourceNamesSubscribe: []string{"*"}, ResourceNamesUnsubscribe: []string{"*"},
		InitialResourceVersions: map[string]string{"/10.244.2.20": ""},
	}
	if diff := cmp.Diff(want, firstRequests(t, restarted.wire, 0)[0], protocmp.Transform()); diff != "" {
		t.Errorf("first Address request after reconnect (-want +got):\n%s", diff)
	}
	if p.table.Workload(remoteUID) == nil {
		t.Error("looked-up workload not in the table")
	}
}

// TestReconnect: after the control plane restarts, the client's new
// stream carries what it holds as initial_resource_versions; it is sent
// only what changed meanwhile, a removal included.
func TestReconnect(t *testing.T) {
	t.Parallel()
	src := newSource()
	src.putAddress(workload(localUID, "echo-local", proxyNode, "10.244.1.10"))
	src.putAddress(workload(remoteUID, "echo-remote", "node-b", "10.244.2.20"))
	src.putAddress(service("10.96.0.10"))
	src.putPolicy(policy("allow", security.Action_ALLOW))
	cp := startControlPlane(t, src, "127.0.0.1:0")
	p := newProxy(t, cp.addr, options{})
	p.run(t)
	p.ready(t)
	eventually(t, "the whole table arrives", func() bool { return len(p.table.Snapshot().Workloads) == 2 })
	p.settled(t, cp)
	held := map[string]map[string]string{}
	for _, typ := range []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL} {
		held[typ] = p.client.Versions(typ)
	}

	cp.stop()
	src.mu.Lock()
	delete(src.addrs, remoteUID)
	src.addrs[localUID] = workload(localUID, "echo-local", proxyNode, "10.244.1.11")
	src.mu.Unlock()
	restarted := startControlPlane(t, src, cp.addr)

	first := firstRequests(t, restarted.wire, 0)
	for i, typ := range []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL} {
		want := &discoveryv3.DeltaDiscoveryRequest{Node: p.node, TypeUrl: typ, InitialResourceVersions: held[typ]}
		if diff := cmp.Diff(want, first[i], protocmp.Transform()); diff != "" {
			t.Errorf("first %s request after reconnect (-want +got):\n%s", typ, diff)
		}
	}
	eventually(t, "the changes arrive", func() bool {
		return p.table.Workload(remoteUID) == nil && p.table.Has("/10.244.1.11")
	})
	p.settled(t, cp, restarted)
	l := restarted.wire.stream(0)
	var resent []string
	for _, r := range l.resps {
		for _, res := range r.GetResources() {
			if held[r.GetTypeUrl()][res.GetName()] == res.GetVersion() {
				resent = append(resent, res.GetName())
			}
		}
	}
	if len(resent) > 0 {
		t.Errorf("unchanged resources sent again: %q", resent)
	}
	for _, typ := range []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL} {
		if diff := cmp.Diff(versions(l, typ, held[typ]), p.client.Versions(typ)); diff != "" {
			t.Errorf("Versions(%s) after reconnect (-want +got):\n%s", typ, diff)
		}
	}
	if p.table.Service(echoKey) == nil || p.table.Policy("apps/allow") == nil {
		t.Error("unchanged resources lost over the reconnect")
	}
	if !strings.Contains(first[0].GetNode().GetId(), "ztunnel-a") {
		t.Error("node missing after reconnect")
	}
}
