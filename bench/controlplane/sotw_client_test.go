package controlplane_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The Envoy types a proxyless gRPC client subscribes to, in the order of
// its dependencies: listeners name routes, routes clusters, clusters
// endpoints.
const (
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	routeType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	endpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// chain lists the types in dependency order.
var chain = [...]string{listenerType, routeType, clusterType, endpointType}

// table is what a client holds of one type: name → decoded resource.
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

// sotwClient is a state-of-the-world ADS stream that behaves as grpc-go's
// xDS client: it asks for the listeners it is given, then for the route
// configurations they name, the clusters those name and the clusters'
// endpoints, asking again whenever a set of names changes, and ACKs every
// response (NACKs one that does not decode). It keeps what it was sent,
// decoded, and reports when it is first synced and when a response makes
// an expectation true. Its methods are safe for concurrent use.
type sotwClient struct {
	name   string
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	// synced is closed once every type has been answered after its last
	// request; syncedAt is when.
	synced chan struct{}
	// ended is closed, with err set, when the stream ends.
	ended chan struct{}

	mu       sync.Mutex
	syncedAt time.Time
	err      error
	names    map[string][]string // type → names asked for, sorted
	tables   map[string]table
	last     map[string]*discoveryv3.DiscoveryResponse
	pending  map[string]bool // type → asked, not answered yet
	nack     error
	expects  []*expectation
	received map[string]traffic
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

// dialSotW opens a client's stream on conn with headers md and asks for
// listeners. The client owns conn and closes it in close.
func dialSotW(ctx context.Context, name string, conn *grpc.ClientConn, md metadata.MD, node *corev3.Node, listeners []string) (*sotwClient, error) {
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	c := &sotwClient{
		name: name, conn: conn, cancel: cancel, synced: make(chan struct{}), ended: make(chan struct{}),
		names: map[string][]string{}, tables: map[string]table{}, last: map[string]*discoveryv3.DiscoveryResponse{}, pending: map[string]bool{},
		received: map[string]traffic{},
	}
	for _, typ := range chain {
		c.tables[typ] = table{}
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("open stream of %s: %w", name, err)
	}
	c.names[listenerType] = slices.Sorted(slices.Values(listeners))
	c.pending[listenerType] = true
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: listenerType, ResourceNames: c.names[listenerType]}); err != nil {
		c.close()
		return nil, fmt.Errorf("ask for listeners of %s: %w", name, err)
	}
	go func() {
		err := c.run(stream)
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.ended)
	}()
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
	tbl, ok := c.tables[typ]
	if !ok {
		return nil
	}
	tr := c.received[typ]
	tr.Responses++
	tr.Resources += len(resp.GetResources())
	tr.Bytes += proto.Size(resp)
	c.received[typ] = tr
	fresh := table{}
	for _, r := range resp.GetResources() {
		name, m, err := decode(typ, r.GetTypeUrl(), r.GetValue())
		if err != nil {
			c.nack = fmt.Errorf("%s: %w", c.name, err)
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: c.names[typ], ResponseNonce: resp.GetNonce(),
				ErrorDetail: &rpcstatus.Status{Message: err.Error()}}
			if prev := c.last[typ]; prev != nil {
				ack.VersionInfo = prev.GetVersionInfo()
			}
			return []*discoveryv3.DiscoveryRequest{ack}
		}
		fresh[name] = m
	}
	out := []*discoveryv3.DiscoveryRequest{{TypeUrl: typ, VersionInfo: resp.GetVersionInfo(), ResourceNames: c.names[typ], ResponseNonce: resp.GetNonce()}}
	c.last[typ] = resp
	c.pending[typ] = false
	if typ == listenerType || typ == clusterType {
		// Each response holds the whole set.
		clear(tbl)
	}
	maps.Copy(tbl, fresh)
	for i, dep := range chain[:len(chain)-1] {
		next := chain[i+1]
		want := referenced(dep, c.tables[dep])
		if slices.Equal(want, c.names[next]) {
			continue
		}
		c.names[next] = want
		c.pending[next] = true
		for name := range c.tables[next] {
			if _, ok := slices.BinarySearch(want, name); !ok {
				delete(c.tables[next], name)
			}
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: next, ResourceNames: want}
		if prev := c.last[next]; prev != nil {
			req.VersionInfo, req.ResponseNonce = prev.GetVersionInfo(), prev.GetNonce()
		}
		out = append(out, req)
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

// isSynced reports whether every type has been asked for and answered.
func (c *sotwClient) isSynced() bool {
	for _, typ := range chain {
		if c.pending[typ] || c.last[typ] == nil {
			return false
		}
	}
	return true
}

// decode unmarshals one resource and returns the name it carries.
func decode(typ, anyType string, b []byte) (string, proto.Message, error) {
	if anyType != typ {
		return "", nil, fmt.Errorf("resource of type %s in a response of %s", anyType, typ)
	}
	var m interface {
		proto.Message
		GetName() string
	}
	switch typ {
	case listenerType:
		m = &listenerv3.Listener{}
	case routeType:
		m = &routev3.RouteConfiguration{}
	case clusterType:
		m = &clusterv3.Cluster{}
	case endpointType:
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := proto.Unmarshal(b, cla); err != nil {
			return "", nil, fmt.Errorf("decode %s: %w", typ, err)
		}
		return cla.GetClusterName(), cla, nil
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return "", nil, fmt.Errorf("decode %s: %w", typ, err)
	}
	return m.GetName(), m, nil
}

// referenced returns the names of the next type that a table names,
// sorted: a listener's route configuration, a route's clusters, an EDS
// cluster's service name.
func referenced(typ string, tbl table) []string {
	names := map[string]bool{}
	for _, m := range tbl {
		switch r := m.(type) {
		case *listenerv3.Listener:
			var hcm hcmv3.HttpConnectionManager
			if r.GetApiListener().GetApiListener().UnmarshalTo(&hcm) == nil && hcm.GetRds() != nil {
				names[hcm.GetRds().GetRouteConfigName()] = true
			}
		case *routev3.RouteConfiguration:
			for _, vh := range r.GetVirtualHosts() {
				for _, rt := range vh.GetRoutes() {
					if c := rt.GetRoute().GetCluster(); c != "" {
						names[c] = true
					}
					for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
						names[wc.GetName()] = true
					}
				}
			}
		case *clusterv3.Cluster:
			if r.GetType() == clusterv3.Cluster_EDS {
				names[cmp.Or(r.GetEdsClusterConfig().GetServiceName(), r.GetName())] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(names))
}

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

// await waits for an expectation of expect.
func (c *sotwClient) await(ctx context.Context, at <-chan time.Time) (time.Time, error) {
	select {
	case t := <-at:
		return t, nil
	case <-c.ended:
		return time.Time{}, c.failure()
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%s: expected response not received: %w", c.name, ctx.Err())
	}
}

// snapshot returns a copy of the client's table of typ; the resources are
// shared and must not be changed.
func (c *sotwClient) snapshot(typ string) table {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.tables[typ])
}

// traffic returns what the client has received so far, by type.
func (c *sotwClient) traffic() map[string]traffic {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.received)
}

// failure is why the stream ended, or the NACK it sent.
func (c *sotwClient) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cmp.Or(c.nack, c.err, errors.New(c.name+": stream ended"))
}

// close ends the stream and the connection.
func (c *sotwClient) close() {
	c.cancel()
	c.conn.Close()
}

// healthyEndpoints returns the addresses of the endpoints of an endpoint
// table that a client would send to (health unknown or healthy), by the
// host of their cluster (the last field of Istio's cluster names,
// "outbound|<port>|<subset>|<host>").
func healthyEndpoints(tbl table) map[string][]string {
	out := map[string][]string{}
	for name, m := range tbl {
		host := name[strings.LastIndexByte(name, '|')+1:]
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
