package xds_test

import (
	stdcmp "cmp"
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
)

var (
	rebuildSeed  = flag.Uint64("rebuild-seed", 0, "TestEventsMatchARebuild: the random sequence's seed (0: from the clock, logged)")
	rebuildSteps = flag.Int("rebuild-steps", 400, "TestEventsMatchARebuild: events per run")
)

// TestEventsMatchARebuild drives a random sequence of Kubernetes events
// (pods, Services, EndpointSlices, namespace and node labels, waypoints,
// security policies, Istio traffic configuration, ServiceEntries and
// WorkloadEntries) through an index and the xDS server, as the informers
// do, with three proxies connected: a node proxy (both workload tables),
// an Envoy sidecar and a proxyless gRPC client (every Envoy type, each
// following the names the others reference, as Envoy and grpc-go do).
// After each event, the index's tables must equal those of a new index
// given the same objects, and each proxy must come to hold what that new
// index's tables and a from-scratch generation serve it. A recompute the
// index misses, or a share the cache wrongly keeps, shows as a proxy that
// never gets there.
func TestEventsMatchARebuild(t *testing.T) {
	seed := *rebuildSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-rebuild-seed to repeat)", seed)
	r := rand.New(rand.NewPCG(seed, seed))

	x := index.New(ambient.Config{})
	m := newMesh(t, xds.Config{Mesh: x}, x)
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)
	w := newWorld(m.ns)
	w.populate(r)
	w.applyAll(x, m.server.Changed)

	ztunnel := m.connect(t, "ztunnel-1", "node-1", proxyOptions{})
	sidecarProxy := sidecar.Proxy{Namespace: m.ns, Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr(clientIP)}}
	grpcProxy := sidecar.Proxy{Namespace: m.ns, Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr(grpcClientIP)}}
	envoys := []*envoyView{
		newEnvoyView(t, m, m.envoyNode(t, "sidecar", "client", clientIP, ""), sidecarProxy, false, nil),
		newEnvoyView(t, m, m.envoyNode(t, "sidecar", "grpc-client", grpcClientIP, "grpc"), grpcProxy, true, w.grpcListeners()),
	}

	var history []string
	for step := range *rebuildSteps {
		what := w.change(r)
		history = append(history, what)
		obj := w.objects[w.last]
		m.server.Changed(w.apply(x, w.last, obj))

		fresh := index.New(ambient.Config{})
		w.applyAll(fresh, nil)
		if diff := tablesDiff(fresh, x); diff != "" {
			t.Fatalf("step %d (%s): the index's tables differ from a rebuild's (-rebuild +index):\n%s\nevents:\n%s", step, what, diff, strings.Join(history, "\n"))
		}
		wantTable := tableOf(fresh)
		gen := sidecar.NewMesh(fresh.SidecarInputs())
		want := make([]map[string]map[string]proto.Message, len(envoys))
		for i, e := range envoys {
			want[i] = e.expected(gen)
		}
		// A liveness bound, not a speed one: stale config never converges.
		deadline := time.Now().Add(settle)
		for {
			zdiff := snapshotDiff(wantTable, ztunnel.table.Snapshot())
			var ediffs []string
			for i, e := range envoys {
				e.pump(20 * time.Millisecond)
				if d := e.diff(want[i]); d != "" {
					ediffs = append(ediffs, e.who+": "+d)
				}
			}
			if zdiff == "" && len(ediffs) == 0 {
				break
			}
			if time.Now().After(deadline) {
				if zdiff != "" {
					t.Errorf("step %d (%s): the node proxy's tables differ from a rebuild's (-rebuild +proxy):\n%s", step, what, zdiff)
				}
				for _, d := range ediffs {
					t.Errorf("step %d (%s): %s", step, what, d)
				}
				t.Fatalf("events:\n%s", strings.Join(history, "\n"))
			}
		}
	}
}

// tablesDiff compares two indexes' workload tables.
func tablesDiff(want, got *index.Index) string {
	type tables struct {
		Addresses      map[string]*workloadapi.Address
		Authorizations map[string]proto.Message
	}
	of := func(x *index.Index) tables {
		t := tables{Addresses: map[string]*workloadapi.Address{}, Authorizations: map[string]proto.Message{}}
		for _, n := range x.AddressNames() {
			t.Addresses[n] = x.Address(n)
		}
		for _, n := range x.AuthorizationNames() {
			t.Authorizations[n] = x.Authorization(n)
		}
		return t
	}
	w, g := of(want), of(got)
	same := len(w.Addresses) == len(g.Addresses) && len(w.Authorizations) == len(g.Authorizations)
	for n, a := range w.Addresses {
		same = same && proto.Equal(a, g.Addresses[n])
	}
	for n, a := range w.Authorizations {
		same = same && proto.Equal(a, g.Authorizations[n])
	}
	if same {
		return ""
	}
	return cmp.Diff(w, g, protocmp.Transform())
}

// snapshotDiff compares two node proxies' tables, equal ones quickly.
func snapshotDiff(want, got workloadtable.Snapshot) string {
	equal := func(a, b []proto.Message) bool {
		return slices.EqualFunc(a, b, proto.Equal)
	}
	msgs := func(s workloadtable.Snapshot) [3][]proto.Message {
		var out [3][]proto.Message
		for _, w := range s.Workloads {
			out[0] = append(out[0], w)
		}
		for _, v := range s.Services {
			out[1] = append(out[1], v)
		}
		for _, p := range s.Policies {
			out[2] = append(out[2], p)
		}
		return out
	}
	w, g := msgs(want), msgs(got)
	if equal(w[0], g[0]) && equal(w[1], g[1]) && equal(w[2], g[2]) {
		return ""
	}
	return cmp.Diff(want, got, protocmp.Transform())
}

// tableOf is what a node proxy holds of an index's tables.
func tableOf(x *index.Index) workloadtable.Snapshot {
	t := workloadtable.New()
	var addrs, authz []*discoveryv3.Resource
	for _, n := range x.AddressNames() {
		a, _ := anypb.New(x.Address(n))
		addrs = append(addrs, &discoveryv3.Resource{Name: n, Resource: a})
	}
	for _, n := range x.AuthorizationNames() {
		a, _ := anypb.New(x.Authorization(n))
		authz = append(authz, &discoveryv3.Resource{Name: n, Resource: a})
	}
	t.Apply(workloadapi.AddressTypeURL, addrs, nil)
	t.Apply(workloadapi.AuthorizationTypeURL, authz, nil)
	return t.Snapshot()
}

// envoyView is a Delta ADS client that holds what it is sent, ACKs it,
// and subscribes to the names the resources it holds reference: a
// sidecar to every cluster's endpoints and every listener's routes
// (clusters and listeners as wildcards), a proxyless client to its
// listeners' routes, their clusters and those clusters' endpoints.
type envoyView struct {
	t         *testing.T
	who       string
	s         *deltaADS
	proxy     sidecar.Proxy
	proxyless bool
	listeners []string
	held      map[string]map[string]*anypb.Any
	asked     map[string][]string
}

func newEnvoyView(t *testing.T, m *mesh, node *corev3.Node, p sidecar.Proxy, proxyless bool, listeners []string) *envoyView {
	// The stream lasts as long as the test may.
	s := openADSFor(t, m, time.Hour, func(ctx context.Context, c discoveryv3.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], error) {
		return c.DeltaAggregatedResources(ctx)
	})
	e := &envoyView{t: t, who: "sidecar", s: s, proxy: p, proxyless: proxyless, listeners: listeners,
		held: map[string]map[string]*anypb.Any{}, asked: map[string][]string{}}
	first := &discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: lds}
	if proxyless {
		e.who = "proxyless"
		first.ResourceNamesSubscribe = listeners
		e.asked[lds] = listeners
	}
	e.s.send(first)
	if !proxyless {
		e.s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	}
	return e
}

// pump applies and ACKs the responses that arrive until none has for d,
// and follows the names they reference.
func (e *envoyView) pump(d time.Duration) {
	for {
		timeout := time.After(d)
		select {
		case r, ok := <-e.s.in:
			if !ok {
				e.t.Fatalf("%s: stream ended: %v", e.who, e.s.err)
			}
			typ := r.GetTypeUrl()
			if e.held[typ] == nil {
				e.held[typ] = map[string]*anypb.Any{}
			}
			for _, res := range r.GetResources() {
				// An answer to a name the client has since unsubscribed
				// from is ignored, as Envoy ignores it.
				if e.asked[typ] == nil || slices.Contains(e.asked[typ], res.GetName()) {
					e.held[typ][res.GetName()] = res.GetResource()
				}
			}
			for _, n := range r.GetRemovedResources() {
				delete(e.held[typ], n)
			}
			e.s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: r.GetNonce()})
			e.follow()
		case <-timeout:
			return
		}
	}
}

// follow subscribes to the names the held resources reference and
// unsubscribes from those no longer referenced, until that changes
// nothing (a cluster unsubscribed from references no endpoints).
func (e *envoyView) follow() {
	for e.followOnce() {
	}
}

func (e *envoyView) followOnce() (changed bool) {
	held := func(typ string) []proto.Message {
		var out []proto.Message
		for _, a := range e.held[typ] {
			m, err := a.UnmarshalNew()
			if err != nil {
				e.t.Fatalf("%s: %v", e.who, err)
			}
			out = append(out, m)
		}
		return out
	}
	for typ, names := range referenced(held, e.proxyless) {
		was := e.asked[typ]
		var sub, unsub []string
		for _, n := range names {
			if !slices.Contains(was, n) {
				sub = append(sub, n)
			}
		}
		for _, n := range was {
			if !slices.Contains(names, n) {
				unsub = append(unsub, n)
			}
		}
		for _, n := range unsub {
			delete(e.held[typ], n)
		}
		if len(sub)+len(unsub) > 0 {
			e.asked[typ] = names
			e.s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub})
			changed = true
		}
	}
	return changed
}

// referenced are the names of each type that the resources held (by
// type) reference: endpoints of clusters, routes of listeners, and for a
// proxyless client the clusters of routes.
func referenced(held func(typ string) []proto.Message, proxyless bool) map[string][]string {
	out := map[string][]string{}
	addName := func(typ, n string) {
		if n != "" && !slices.Contains(out[typ], n) {
			out[typ] = append(out[typ], n)
		}
	}
	for _, m := range held(lds) {
		l := m.(*listenerv3.Listener)
		chains := append(slices.Clone(l.GetFilterChains()), l.GetDefaultFilterChain())
		var hcms []*anypb.Any
		if api := l.GetApiListener().GetApiListener(); api != nil {
			hcms = append(hcms, api)
		}
		for _, c := range chains {
			for _, f := range c.GetFilters() {
				hcms = append(hcms, f.GetTypedConfig())
			}
		}
		for _, a := range hcms {
			var hcm hcmv3.HttpConnectionManager
			if a.MessageIs(&hcm) && a.UnmarshalTo(&hcm) == nil {
				addName(rds, hcm.GetRds().GetRouteConfigName())
			}
		}
	}
	if proxyless {
		for _, m := range held(rds) {
			for _, vh := range m.(*routev3.RouteConfiguration).GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					addName(cds, r.GetRoute().GetCluster())
					for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
						addName(cds, wc.GetName())
					}
				}
			}
		}
	}
	for _, m := range held(cds) {
		c := m.(*clusterv3.Cluster)
		if c.GetType() == clusterv3.Cluster_EDS {
			addName(eds, stdcmp.Or(c.GetEdsClusterConfig().GetServiceName(), c.GetName()))
		}
	}
	for _, typ := range []string{cds, eds, rds} {
		if proxyless || typ != cds {
			slices.Sort(out[typ])
			if out[typ] == nil {
				out[typ] = []string{}
			}
		}
	}
	return out
}

// expected is what a from-scratch generation serves the client,
// following the same references, by type and name.
func (e *envoyView) expected(gen *sidecar.Mesh) map[string]map[string]proto.Message {
	want := map[string]map[string]proto.Message{}
	generate := func(typ string, names []string) {
		want[typ] = map[string]proto.Message{}
		var shares []sidecar.Share
		if e.proxyless {
			shares = gen.GRPCShares(e.proxy, typ, names)
		} else {
			shares = gen.SidecarShares(e.proxy, typ, names)
		}
		for _, s := range shares {
			for _, n := range s.Generate(nil) {
				want[typ][n.Name] = n.Resource
			}
		}
	}
	wanted := func(typ string) []proto.Message { return slices.Collect(maps.Values(want[typ])) }
	if e.proxyless {
		generate(lds, e.listeners)
		generate(rds, referenced(wanted, true)[rds])
		generate(cds, referenced(wanted, true)[cds])
	} else {
		generate(lds, nil)
		generate(cds, nil)
		generate(rds, referenced(wanted, false)[rds])
	}
	generate(eds, referenced(wanted, e.proxyless)[eds])
	return want
}

// diff compares what the client holds with want.
func (e *envoyView) diff(want map[string]map[string]proto.Message) string {

	// Name by name: a whole mesh's diff would bury the one that differs.
	var diffs []string
	for _, typ := range []string{cds, eds, lds, rds} {
		names := slices.Sorted(maps.Keys(want[typ]))
		for n := range e.held[typ] {
			if _, ok := want[typ][n]; !ok {
				names = append(names, n)
			}
		}
		for _, n := range names {
			var got proto.Message
			if a, ok := e.held[typ][n]; ok {
				m, err := a.UnmarshalNew()
				if err != nil {
					return err.Error()
				}
				got = m
			}
			if w := want[typ][n]; w != nil && got != nil && proto.Equal(w, got) {
				continue
			}
			if d := cmp.Diff(want[typ][n], got, protocmp.Transform()); d != "" {
				diffs = append(diffs, fmt.Sprintf("%s %q (-rebuild +proxy):\n%s", short(typ), n, d))
			}
		}
	}
	return strings.Join(diffs, "\n")
}
