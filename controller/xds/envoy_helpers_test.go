package xds_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/xds"
)

// Short names of the Envoy types in these tests.
const (
	cds = sidecar.ClusterType
	eds = sidecar.EndpointType
	lds = sidecar.ListenerType
	rds = sidecar.RouteType
)

// fakeMesh is a mesh whose Envoy resources a test sets by type and name,
// each at a content version. What a client gets is tagged with who it
// was generated for ("sidecar v1", "proxyless v1"; a sidecar's clusters
// and listeners also with its addresses), so a test sees when a client
// gets another kind's or another address's resource. A sidecar's
// clusters and listeners are every one set; everything else answers the
// names asked for.
type fakeMesh struct {
	mu       sync.Mutex
	versions map[string]map[string]string
	panicOn  string
}

func newFakeMesh() *fakeMesh {
	return &fakeMesh{versions: map[string]map[string]string{cds: {}, eds: {}, lds: {}, rds: {}}}
}

// SidecarInputs implements xds.MeshSource; the fake's generator ignores
// them.
func (f *fakeMesh) SidecarInputs() sidecar.Inputs { return sidecar.Inputs{} }

// set puts name at version; version "" removes it.
func (f *fakeMesh) set(typ, name, version string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if version == "" {
		delete(f.versions[typ], name)
		return
	}
	f.versions[typ][name] = version
}

// generator is the fake's xds.Config.NewGenerator: a snapshot of what is
// set now.
func (f *fakeMesh) generator(sidecar.Inputs) xds.Generator {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := fakeGenerator{versions: map[string]map[string]string{}, panicOn: f.panicOn}
	for typ, vs := range f.versions {
		g.versions[typ] = maps.Clone(vs)
	}
	return g
}

type fakeGenerator struct {
	versions map[string]map[string]string
	panicOn  string
}

// DepsOf implements xds.Generator: each generation's are its own, so
// nothing is taken over from the last one.
func (g fakeGenerator) DepsOf(*sidecar.Reads) string { return fmt.Sprintf("%p", g.versions) }

// GRPCShares implements xds.Generator: a share per name.
func (g fakeGenerator) GRPCShares(_ sidecar.Proxy, typ string, names []string) []sidecar.Share {
	return g.perName("proxyless", typ, names)
}

// SidecarShares implements xds.Generator: a share per name, or for a
// wildcard type one share of every name set, tagged with the proxy's
// addresses.
func (g fakeGenerator) SidecarShares(p sidecar.Proxy, typ string, names []string) []sidecar.Share {
	if !sidecar.IsWildcard(typ) {
		return g.perName("sidecar", typ, names)
	}
	var ips []string
	for _, ip := range p.IPs {
		ips = append(ips, ip.String())
	}
	who := "sidecar " + strings.Join(ips, ",")
	return []sidecar.Share{{Key: who, Generate: func(*sidecar.Reads) []sidecar.Named {
		return g.answer(who, typ, slices.Sorted(maps.Keys(g.versions[typ])))
	}}}
}

func (g fakeGenerator) perName(who, typ string, names []string) []sidecar.Share {
	var out []sidecar.Share
	for _, n := range names {
		out = append(out, sidecar.Share{Name: n, Generate: func(*sidecar.Reads) []sidecar.Named { return g.answer(who, typ, []string{n}) }})
	}
	return out
}

func (g fakeGenerator) answer(who, typ string, names []string) []sidecar.Named {
	var out []sidecar.Named
	for _, n := range names {
		if n == g.panicOn {
			panic("generator bug reached by " + n)
		}
		if v, ok := g.versions[typ][n]; ok {
			out = append(out, sidecar.Named{Name: n, Resource: fakeResource(typ, n, who+" "+v)})
		}
	}
	return out
}

// fakeResource is a resource of typ named name that carries tag.
func fakeResource(typ, name, tag string) proto.Message {
	switch typ {
	case cds:
		return &clusterv3.Cluster{Name: name, AltStatName: tag}
	case eds:
		return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{Locality: &corev3.Locality{Region: tag}}}}
	case lds:
		return &listenerv3.Listener{Name: name, StatPrefix: tag}
	}
	return &routev3.RouteConfiguration{Name: name, InternalOnlyHeaders: []string{tag}}
}

// nameAndTag reads a fake resource back; for an endpoint assignment of
// the real generators the tag is its endpoints' addresses ("ip:port",
// also for an endpoint reached over HBONE).
func nameAndTag(t testing.TB, a *anypb.Any) (string, string) {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return r.GetName(), r.GetAltStatName()
	case *endpointv3.ClusterLoadAssignment:
		if len(r.GetEndpoints()) == 1 && r.GetEndpoints()[0].GetLocality().GetRegion() != "" {
			return r.GetClusterName(), r.GetEndpoints()[0].GetLocality().GetRegion()
		}
		var addrs []string
		for _, l := range r.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				a := e.GetEndpoint().GetAddress()
				if in := a.GetEnvoyInternalAddress(); in != nil {
					addrs = append(addrs, in.GetEndpointId()) // over HBONE: "ip:port"
					continue
				}
				sa := a.GetSocketAddress()
				addrs = append(addrs, sa.GetAddress()+":"+strconv.FormatUint(uint64(sa.GetPortValue()), 10))
			}
		}
		slices.Sort(addrs)
		return r.GetClusterName(), strings.Join(addrs, ",")
	case *listenerv3.Listener:
		return r.GetName(), r.GetStatPrefix()
	case *routev3.RouteConfiguration:
		return r.GetName(), strings.Join(r.GetInternalOnlyHeaders(), ",")
	}
	t.Fatalf("unexpected resource %T", m)
	return "", ""
}

// reply is what a test compares of a response: its type, its resources'
// tags by name, and the names it removes.
type reply struct {
	Type      string
	Resources map[string]string
	Removed   []string
}

func deltaReply(t testing.TB, r *discoveryv3.DeltaDiscoveryResponse) reply {
	t.Helper()
	got := reply{Type: short(r.GetTypeUrl()), Resources: map[string]string{}, Removed: r.GetRemovedResources()}
	for _, res := range r.GetResources() {
		name, tag := nameAndTag(t, res.GetResource())
		if name != res.GetName() {
			t.Errorf("resource %q sent under the name %q", name, res.GetName())
		}
		if res.GetVersion() == "" {
			t.Errorf("%s %q sent without a version", got.Type, name)
		}
		got.Resources[name] = tag
	}
	return got
}

func sotwReply(t testing.TB, r *discoveryv3.DiscoveryResponse) reply {
	t.Helper()
	got := reply{Type: short(r.GetTypeUrl()), Resources: map[string]string{}}
	for _, a := range r.GetResources() {
		name, tag := nameAndTag(t, a)
		got.Resources[name] = tag
	}
	return got
}

func short(typ string) string {
	switch typ {
	case cds:
		return "CDS"
	case eds:
		return "EDS"
	case lds:
		return "LDS"
	case rds:
		return "RDS"
	}
	return typ
}

// res builds a reply's resources from name, tag pairs.
func res(nameTags ...string) map[string]string {
	out := map[string]string{}
	for i := 0; i+1 < len(nameTags); i += 2 {
		out[nameTags[i]] = nameTags[i+1]
	}
	return out
}

// startFakeMesh serves fake's resources to Envoy clients (and an
// ambient table of one workload), against the test API server's
// authentication.
func startFakeMesh(t *testing.T, cfg xds.Config, fake *fakeMesh) *mesh {
	t.Helper()
	cfg.Mesh, cfg.NewGenerator = fake, fake.generator
	m := newMesh(t, cfg, &fakeSource{n: 1})
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)
	return m
}

// meshChanged tells the server the mesh changed, as the informers do.
func (m *mesh) meshChanged() { m.server.Changed(index.ChangeSet{SidecarInputs: true}) }

// envoyNode is an Envoy client's node: nodeType "sidecar" or "router",
// generator "grpc" for a proxyless client.
func (m *mesh) envoyNode(t testing.TB, nodeType, pod, ip, generator string) *corev3.Node {
	t.Helper()
	fields := map[string]any{
		"NAMESPACE": m.ns, "SERVICE_ACCOUNT": "default", "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "test",
		"INSTANCE_IPS": ip, "LABELS": map[string]any{"app": "client"},
	}
	if generator != "" {
		fields["GENERATOR"] = generator
	}
	md, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: fmt.Sprintf("%s~%s~%s.%s~%s.svc.cluster.local", nodeType, ip, pod, m.ns, m.ns), Metadata: md}
}

// adsStream is a raw ADS stream, state of the world or Delta, whose
// responses one goroutine reads.
type adsStream[Req, Resp any] struct {
	t      *testing.T
	st     grpc.BidiStreamingClient[Req, Resp]
	cancel context.CancelFunc
	in     chan *Resp
	// err is the stream's end, once in is closed.
	err error
	// barriers counts the barrier names subscribed to.
	barriers int
}

func openADS[Req, Resp any](t *testing.T, m *mesh, open func(context.Context, discoveryv3.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[Req, Resp], error)) *adsStream[Req, Resp] {
	t.Helper()
	return openADSFor(t, m, time.Minute, open)
}

// openADSFor is openADS with a stream that lasts d.
func openADSFor[Req, Resp any](t *testing.T, m *mesh, d time.Duration, open func(context.Context, discoveryv3.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[Req, Resp], error)) *adsStream[Req, Resp] {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token(t))
	st, err := open(ctx, discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)))
	if err != nil {
		t.Fatal(err)
	}
	s := &adsStream[Req, Resp]{t: t, st: st, cancel: cancel, in: make(chan *Resp, 64)}
	go func() {
		defer close(s.in)
		for {
			r, err := st.Recv()
			if err != nil {
				s.err = err
				return
			}
			s.in <- r
		}
	}()
	return s
}

// deltaStream opens a Delta stream.
func (m *mesh) deltaStream(t *testing.T) *adsStream[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse] {
	t.Helper()
	return openADS(t, m, func(ctx context.Context, c discoveryv3.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], error) {
		return c.DeltaAggregatedResources(ctx)
	})
}

// sotwStream opens a state-of-the-world stream.
func (m *mesh) sotwStream(t *testing.T) *adsStream[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse] {
	t.Helper()
	return openADS(t, m, func(ctx context.Context, c discoveryv3.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], error) {
		return c.StreamAggregatedResources(ctx)
	})
}

func (s *adsStream[Req, Resp]) send(req *Req) {
	s.t.Helper()
	if err := s.st.Send(req); err != nil {
		s.t.Fatalf("send: %v (stream: %v)", err, s.end())
	}
}

func (s *adsStream[Req, Resp]) recv() *Resp {
	s.t.Helper()
	select {
	case r, ok := <-s.in:
		if !ok {
			s.t.Fatalf("stream ended: %v", s.err)
		}
		return r
	case <-time.After(20 * time.Second):
		s.t.Fatal("no response in 20s")
	}
	return nil
}

// end waits for the stream's end and returns its status.
func (s *adsStream[Req, Resp]) end() error {
	s.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case _, ok := <-s.in:
			if !ok {
				return s.err
			}
		case <-deadline:
			s.t.Fatal("stream did not end in 20s")
		}
	}
}

// close ends the stream from the client's side.
func (s *adsStream[Req, Resp]) close() {
	s.cancel()
	for range s.in {
	}
}

type deltaADS = adsStream[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

type sotwADS = adsStream[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

// nothingFor checks that the requests sent since the last response
// were not answered: it subscribes to a name nothing answers on typ (a
// non-wildcard type whose watch has no warming answer due), which is
// answered at once (the watch's whole set, the name removed), so the
// next response must be that answer.
func nothingFor(t *testing.T, s *deltaADS, typ, why string) {
	t.Helper()
	s.barriers++
	name := fmt.Sprintf("barrier-%d", s.barriers)
	s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: []string{name}})
	r := deltaReply(t, s.recv())
	got := reply{Type: r.Type, Removed: r.Removed}
	want := reply{Type: short(typ), Removed: []string{name}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s: answered (-want +got, the barrier's answer expected):\n%s", why, diff)
	}
}

// nothingForSotW is nothingFor on a state-of-the-world stream: a new
// name on typ, whose last response was nonce, is answered at once (a
// sidecar's listeners: any change of names is). It returns that answer.
func nothingForSotW(t *testing.T, s *sotwADS, typ, nonce, why string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	s.barriers++
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, ResourceNames: []string{fmt.Sprintf("barrier-%d", s.barriers)}})
	r := s.recv()
	if r.GetTypeUrl() != typ {
		t.Fatalf("%s: answered with %s", why, sotwReply(t, r).Type)
	}
	return r
}
