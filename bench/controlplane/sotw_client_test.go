package controlplane_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The Envoy types the clients subscribe to, in the order of a proxyless
// gRPC client's dependencies: listeners name routes, routes clusters,
// clusters endpoints.
const (
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	routeType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	endpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// chain lists the types in dependency order.
var chain = [...]string{listenerType, routeType, clusterType, endpointType}

// table is what a client keeps decoded of one type: name → resource.
type table map[string]proto.Message

// grpcNode is the node a proxyless gRPC client of pod pod (namespace ns,
// service account sa, address ip) sends, as Istio's agent writes it into
// the client's bootstrap.
func grpcNode(ns, pod, sa, ip string, labels map[string]string) (*corev3.Node, error) {
	lbls := map[string]any{}
	for k, v := range labels {
		lbls[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"GENERATOR": "grpc", "NAME": pod, "NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "INSTANCE_IPS": ip,
		"CLUSTER_ID": "Kubernetes", "LABELS": lbls,
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns), Metadata: md}, nil
}

// subscription is how a client subscribes: what it asks for first and
// which types' names follow from which.
type subscription struct {
	// first are the types asked for when the stream opens, in order,
	// with their names (none: a wildcard).
	first []request
	// deps are the pairs (type, next type) whose next names are what the
	// resources of type name.
	deps [][2]string
	// keep reports whether a resource is kept decoded, for expectations
	// and checks (it must depend on the type and name only); project, if
	// set, trims what is kept. Others are held only as a hash of their
	// bytes and the names they reference.
	keep    func(typ, name string) bool
	project func(proto.Message) proto.Message
	// complete: a type asked for by name is answered only once every
	// name has been sent.
	complete bool
}

// request is one type and the names asked for.
type request struct {
	typ   string
	names []string
}

// proxylessSubscription subscribes as grpc-go's xDS client does: the
// listeners it is given, then the route configurations they name, the
// clusters those name and the clusters' endpoints. Everything is kept.
func proxylessSubscription(listeners []string) subscription {
	return subscription{
		first: []request{{listenerType, listeners}},
		deps:  [][2]string{{listenerType, routeType}, {routeType, clusterType}, {clusterType, endpointType}},
		keep:  func(string, string) bool { return true },
	}
}

// sotwClient is a state-of-the-world ADS stream that subscribes as its
// subscription says, asking again whenever a set of names changes, and
// ACKs every response (NACKs one that does not decode). It keeps of each
// resource a hash of its bytes and the names it references, decodes a
// resource only when its bytes changed, keeps decoded only what the
// subscription keeps, and reports when it is first synced and when a
// response makes an expectation true. Its methods are safe for
// concurrent use.
type sotwClient struct {
	clientStream
	sub  subscription
	seed maphash.Seed
	// synced is closed once every type has been answered after its last
	// request; syncedAt is when.
	synced chan struct{}

	// Guarded by mu:
	syncedAt time.Time
	names    map[string][]string // type → names asked for, sorted; none for a wildcard
	entries  map[string]map[string]entry
	tables   map[string]table // type → what is kept decoded
	last     map[string]answer
	pending  map[string]bool // type → asked, not answered yet
	expects  []*expectation
}

// entry is what a client holds of one resource.
type entry struct {
	sum  uint64   // hash of its bytes
	refs []string // the names of the next type it references
}

// answer is the version and nonce of the last response of a type that
// was ACKed.
type answer struct {
	version, nonce string
}

// traffic counts what a client received of one type.
type traffic struct {
	Responses, Resources, Bytes int
}

// expectation is a condition on one type's table that a response is
// awaited to make true.
type expectation struct {
	typ  string
	cond func(table) bool
	at   chan time.Time // receives the response's arrival, once
}

// maxResponse bounds a response's size: a sidecar's clusters of a mesh of
// 1,000 Services run past gRPC's default of 4 MiB (Envoy sets no such
// limit).
const maxResponse = 256 << 20

// dialSotW opens a client's stream on conn with headers md and sends the
// subscription's first requests, the first with node. The client owns
// conn and closes it in close.
func dialSotW(ctx context.Context, name string, conn *grpc.ClientConn, md metadata.MD, node *corev3.Node, sub subscription) (*sotwClient, error) {
	c := &sotwClient{
		sub: sub, seed: maphash.MakeSeed(), synced: make(chan struct{}),
		names: map[string][]string{}, entries: map[string]map[string]entry{}, tables: map[string]table{}, last: map[string]answer{},
		pending: map[string]bool{},
	}
	ctx = c.open(ctx, name, conn, md)
	for _, typ := range chain {
		c.entries[typ] = map[string]entry{}
		c.tables[typ] = table{}
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxResponse))
	if err != nil {
		c.close()
		return nil, fmt.Errorf("open stream of %s: %w", name, err)
	}
	for i, r := range sub.first {
		if len(r.names) > 0 {
			c.names[r.typ] = slices.Sorted(slices.Values(r.names))
		}
		c.pending[r.typ] = true
		req := &discoveryv3.DiscoveryRequest{TypeUrl: r.typ, ResourceNames: c.names[r.typ]}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			c.close()
			return nil, fmt.Errorf("ask %s for %s: %w", name, shortType(r.typ), err)
		}
	}
	c.serve(func() error { return c.run(stream) })
	return c, nil
}

func (c *sotwClient) run(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("stream of %s: %w", c.name, err)
		}
		for _, req := range c.apply(resp, time.Now()) {
			if err := stream.Send(req); err != nil {
				return fmt.Errorf("request of %s: %w", c.name, err)
			}
		}
	}
}

// apply keeps a response that arrived at at and returns the requests
// that follow it: its ACK (or NACK), then a request for every type whose
// names it changed.
func (c *sotwClient) apply(resp *discoveryv3.DiscoveryResponse, at time.Time) []*discoveryv3.DiscoveryRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	typ := resp.GetTypeUrl()
	ents, ok := c.entries[typ]
	if !ok {
		return nil
	}
	c.count(typ, resp, len(resp.GetResources()))
	fresh := make(map[string]entry, len(resp.GetResources()))
	kept := table{}
	for _, r := range resp.GetResources() {
		name, e, m, err := c.read(typ, r.GetTypeUrl(), r.GetValue())
		if err != nil {
			c.nack = fmt.Errorf("%s: %w", c.name, err)
			prev := c.last[typ]
			return []*discoveryv3.DiscoveryRequest{{TypeUrl: typ, VersionInfo: prev.version, ResourceNames: c.names[typ], ResponseNonce: resp.GetNonce(),
				ErrorDetail: &rpcstatus.Status{Message: err.Error()}}}
		}
		fresh[name] = e
		if m != nil {
			kept[name] = m
		}
	}
	out := []*discoveryv3.DiscoveryRequest{{TypeUrl: typ, VersionInfo: resp.GetVersionInfo(), ResourceNames: c.names[typ], ResponseNonce: resp.GetNonce()}}
	c.last[typ] = answer{version: resp.GetVersionInfo(), nonce: resp.GetNonce()}
	c.pending[typ] = false
	tbl := c.tables[typ]
	if typ == listenerType || typ == clusterType {
		// Each response holds the whole set.
		clear(ents)
		clear(tbl)
	}
	maps.Copy(ents, fresh)
	for name := range fresh {
		delete(tbl, name)
	}
	maps.Copy(tbl, kept)
	for _, d := range c.sub.deps {
		dep, next := d[0], d[1]
		want := c.referenced(dep)
		if slices.Equal(want, c.names[next]) {
			continue
		}
		c.names[next] = want
		c.pending[next] = true
		for name := range c.entries[next] {
			if _, ok := slices.BinarySearch(want, name); !ok {
				delete(c.entries[next], name)
				delete(c.tables[next], name)
			}
		}
		prev := c.last[next]
		out = append(out, &discoveryv3.DiscoveryRequest{TypeUrl: next, ResourceNames: want, VersionInfo: prev.version, ResponseNonce: prev.nonce})
	}
	c.expects = slices.DeleteFunc(c.expects, func(e *expectation) bool {
		if e.typ != typ || !e.cond(tbl) {
			return false
		}
		e.at <- at
		return true
	})
	if c.syncedAt.IsZero() && c.isSynced() {
		c.syncedAt = at
		close(c.synced)
	}
	return out
}

// read returns a resource's name, its entry and, if the subscription
// keeps it, the resource decoded. A resource whose bytes are those the
// client holds already is not decoded again, unless it is kept.
func (c *sotwClient) read(typ, anyType string, b []byte) (string, entry, proto.Message, error) {
	if anyType != typ {
		return "", entry{}, nil, fmt.Errorf("resource of type %s in a response of %s", anyType, typ)
	}
	name, err := resourceName(b)
	if err != nil {
		return "", entry{}, nil, fmt.Errorf("decode %s: %w", typ, err)
	}
	e := entry{sum: maphash.Bytes(c.seed, b)}
	keep := c.sub.keep(typ, name)
	if old, held := c.entries[typ][name]; held && old.sum == e.sum {
		return name, old, c.tables[typ][name], nil
	}
	if !keep && !c.referencing(typ) {
		return name, e, nil, nil
	}
	m, err := decode(typ, b)
	if err != nil {
		return "", entry{}, nil, err
	}
	e.refs = references(m)
	if !keep {
		return name, e, nil, nil
	}
	if c.sub.project != nil {
		m = c.sub.project(m)
	}
	return name, e, m, nil
}

// referencing reports whether the names of some type follow from the
// resources of typ.
func (c *sotwClient) referencing(typ string) bool {
	for _, d := range c.sub.deps {
		if d[0] == typ {
			return true
		}
	}
	return false
}

// isSynced reports whether every type has been asked for and answered
// (and, for a complete subscription, every name asked for sent).
func (c *sotwClient) isSynced() bool {
	for _, typ := range chain {
		if _, answered := c.last[typ]; c.pending[typ] || !answered {
			return false
		}
		if !c.sub.complete {
			continue
		}
		for _, name := range c.names[typ] {
			if _, ok := c.entries[typ][name]; !ok {
				return false
			}
		}
	}
	return true
}

// resourceName reads field 1 of a resource's bytes, the name of each of
// the four types (ClusterLoadAssignment's cluster_name), without decoding
// the rest.
func resourceName(b []byte) (string, error) {
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && wt == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", protowire.ParseError(n)
			}
			return string(v), nil
		}
		n = protowire.ConsumeFieldValue(num, wt, b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
	}
	return "", errors.New("no name")
}

// decode unmarshals one resource of type typ.
func decode(typ string, b []byte) (proto.Message, error) {
	var m proto.Message
	switch typ {
	case listenerType:
		m = &listenerv3.Listener{}
	case routeType:
		m = &routev3.RouteConfiguration{}
	case clusterType:
		m = &clusterv3.Cluster{}
	case endpointType:
		m = &endpointv3.ClusterLoadAssignment{}
	default:
		return nil, fmt.Errorf("decode %s: unknown type", typ)
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", typ, err)
	}
	return m, nil
}

// referenced returns the names of the next type that the resources of
// typ reference, sorted.
func (c *sotwClient) referenced(typ string) []string {
	names := map[string]bool{}
	for _, e := range c.entries[typ] {
		for _, n := range e.refs {
			names[n] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// references returns the names of the next type a resource references: a
// listener's route configurations (of its API listener, for gRPC, or of
// the connection managers of its filter chains, for Envoy), a route's
// clusters, an EDS cluster's service name.
func references(m proto.Message) []string {
	var out []string
	rds := func(a *anypb.Any) {
		var hcm hcmv3.HttpConnectionManager
		if a.MessageIs(&hcm) && a.UnmarshalTo(&hcm) == nil && hcm.GetRds() != nil {
			out = append(out, hcm.GetRds().GetRouteConfigName())
		}
	}
	switch r := m.(type) {
	case *listenerv3.Listener:
		rds(r.GetApiListener().GetApiListener())
		for _, fc := range append(slices.Clone(r.GetFilterChains()), r.GetDefaultFilterChain()) {
			for _, f := range fc.GetFilters() {
				rds(f.GetTypedConfig())
			}
		}
	case *routev3.RouteConfiguration:
		for _, vh := range r.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if c := rt.GetRoute().GetCluster(); c != "" {
					out = append(out, c)
				}
				for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
					out = append(out, wc.GetName())
				}
			}
		}
	case *clusterv3.Cluster:
		if r.GetType() == clusterv3.Cluster_EDS {
			out = append(out, cmp.Or(r.GetEdsClusterConfig().GetServiceName(), r.GetName()))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func shortType(typ string) string { return typ[strings.LastIndexByte(typ, '.')+1:] }

// waitSynced blocks until the client is synced and returns when that
// happened.
func (c *sotwClient) waitSynced(ctx context.Context) (time.Time, error) {
	select {
	case <-c.synced:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.syncedAt, nil
	case <-c.ended:
		return time.Time{}, c.failure()
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		return time.Time{}, fmt.Errorf("%s not synced (pending %v): %w", c.name, c.pending, ctx.Err())
	}
}

// expect registers a condition on the table of typ that a coming response
// is to make true; the channel receives that response's arrival. It is an
// error for the condition to hold already.
func (c *sotwClient) expect(typ string, cond func(table) bool) (<-chan time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cond(c.tables[typ]) {
		return nil, fmt.Errorf("%s: expectation on %s already met", c.name, typ)
	}
	e := &expectation{typ: typ, cond: cond, at: make(chan time.Time, 1)}
	c.expects = append(c.expects, e)
	return e.at, nil
}

// snapshot returns a copy of the client's table of typ; the resources are
// shared and must not be changed.
func (c *sotwClient) snapshot(typ string) table {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.tables[typ])
}

// held returns how many resources of typ the client holds.
func (c *sotwClient) held(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries[typ])
}

// clusterHost is the host of an Istio cluster name,
// "outbound|<port>|<subset>|<host>".
func clusterHost(cluster string) string { return cluster[strings.LastIndexByte(cluster, '|')+1:] }

// healthyEndpoints returns the addresses of the endpoints of an endpoint
// table that a client would send to (health unknown or healthy), by the
// host of their cluster (clusterHost).
func healthyEndpoints(tbl table) map[string][]string {
	out := map[string][]string{}
	for name, m := range tbl {
		host := clusterHost(name)
		for _, loc := range m.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
			for _, ep := range loc.GetLbEndpoints() {
				if h := ep.GetHealthStatus(); h != corev3.HealthStatus_UNKNOWN && h != corev3.HealthStatus_HEALTHY {
					continue
				}
				addr := ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
				if !slices.Contains(out[host], addr) {
					out[host] = append(out[host], addr)
				}
			}
		}
	}
	return out
}
