package parity

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
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
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	// Types the resources' Any fields hold, registered so that decoding
	// and protocmp can look inside them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// The Envoy types a proxyless gRPC client subscribes to, in the order of
// its dependencies (listeners name routes, routes clusters, clusters
// endpoints).
const (
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	routeType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	endpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

var envoyTypes = []string{listenerType, routeType, clusterType, endpointType}

// grpcNode is the node a proxyless gRPC client of pod pod (namespace ns,
// service account sa, address ip, labels labels) sends, as Istio's agent
// writes it into the client's bootstrap.
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

// sotwSubscriber is a state-of-the-world ADS client that subscribes as
// grpc-go's xDS client does: the listener names it is given, then the
// routes the listeners name, the clusters the routes name and the
// endpoints the clusters name, acknowledging every response. It keeps
// what it was sent without interpreting it further. It is safe for
// concurrent use.
type sotwSubscriber struct {
	name string
	now  func() time.Time
	// sidecar: subscribe as an Envoy sidecar does instead: clusters and
	// listeners as wildcards, then the endpoints the clusters name and
	// the routes the listeners name.
	sidecar bool

	mu         sync.Mutex
	tables     map[string]map[string]*anypb.Any // type URL → name → resource
	names      map[string][]string              // type URL → names subscribed, sorted
	last       map[string]*discoveryv3.DiscoveryResponse
	pending    map[string]bool // type URL → names changed since its last response
	nacks      []string
	lastChange time.Time
	err        error
}

// subscribeSotW opens the stream and subscribes to listeners until ctx
// ends.
func subscribeSotW(ctx context.Context, name string, conn *grpc.ClientConn, node *corev3.Node, md metadata.MD, listeners []string) (*sotwSubscriber, error) {
	s := &sotwSubscriber{
		name: name, now: time.Now,
		tables: map[string]map[string]*anypb.Any{}, names: map[string][]string{}, last: map[string]*discoveryv3.DiscoveryResponse{},
		pending: map[string]bool{listenerType: true},
	}
	for _, typ := range envoyTypes {
		s.tables[typ] = map[string]*anypb.Any{}
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", name, err)
	}
	s.names[listenerType] = slices.Sorted(slices.Values(listeners))
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: listenerType, ResourceNames: s.names[listenerType]}); err != nil {
		return nil, fmt.Errorf("subscribe %s to listeners: %w", name, err)
	}
	s.lastChange = s.now()
	s.start(ctx, stream)
	return s, nil
}

// subscribeSidecar opens the stream and subscribes as an Envoy sidecar
// over state-of-the-world ADS until ctx ends: clusters and listeners as
// wildcards (no names), then what they name.
func subscribeSidecar(ctx context.Context, name string, conn *grpc.ClientConn, node *corev3.Node, md metadata.MD) (*sotwSubscriber, error) {
	s := &sotwSubscriber{
		name: name, now: time.Now, sidecar: true,
		tables: map[string]map[string]*anypb.Any{}, names: map[string][]string{}, last: map[string]*discoveryv3.DiscoveryResponse{},
		pending: map[string]bool{clusterType: true, listenerType: true},
	}
	for _, typ := range envoyTypes {
		s.tables[typ] = map[string]*anypb.Any{}
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", name, err)
	}
	for i, typ := range []string{clusterType, listenerType} {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: typ}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			return nil, fmt.Errorf("subscribe %s to %s: %w", name, shortType(typ), err)
		}
	}
	s.lastChange = s.now()
	s.start(ctx, stream)
	return s, nil
}

func (s *sotwSubscriber) start(ctx context.Context, stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) {
	go func() {
		err := s.run(stream)
		s.mu.Lock()
		defer s.mu.Unlock()
		if ctx.Err() == nil {
			s.err = err
		}
	}()
}

func (s *sotwSubscriber) run(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("%s stream: %w", s.name, err)
		}
		for _, req := range s.apply(resp) {
			if err := stream.Send(req); err != nil {
				return fmt.Errorf("%s request: %w", s.name, err)
			}
		}
	}
}

// apply keeps a response and returns the requests that follow it: its
// ACK (or NACK, for a resource that does not decode), then a request for
// every dependent type whose names changed.
func (s *sotwSubscriber) apply(resp *discoveryv3.DiscoveryResponse) []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := resp.GetTypeUrl()
	table, ok := s.tables[typ]
	if !ok {
		return nil
	}
	fresh := map[string]*anypb.Any{}
	var bad error
	for _, r := range resp.GetResources() {
		name, err := resourceName(typ, r)
		if err != nil {
			bad = err
			break
		}
		fresh[name] = r
	}
	ack := &discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: s.names[typ], ResponseNonce: resp.GetNonce()}
	if bad != nil {
		s.nacks = append(s.nacks, bad.Error())
		ack.ErrorDetail = &rpcstatus.Status{Message: bad.Error()}
		if prev := s.last[typ]; prev != nil {
			ack.VersionInfo = prev.GetVersionInfo()
		}
		return []*discoveryv3.DiscoveryRequest{ack}
	}
	ack.VersionInfo = resp.GetVersionInfo()
	s.last[typ] = resp
	s.pending[typ] = false
	changed := false
	if typ == listenerType || typ == clusterType {
		// Each response is the whole set.
		for name := range table {
			if _, ok := fresh[name]; !ok {
				delete(table, name)
				changed = true
			}
		}
	}
	for name, r := range fresh {
		if old, ok := table[name]; !ok || !proto.Equal(old, r) {
			table[name] = r
			changed = true
		}
	}
	if changed {
		s.lastChange = s.now()
	}
	out := []*discoveryv3.DiscoveryRequest{ack}
	deps := [][2]string{{listenerType, routeType}, {routeType, clusterType}, {clusterType, endpointType}}
	if s.sidecar {
		deps = [][2]string{{clusterType, endpointType}, {listenerType, routeType}}
	}
	for _, d := range deps {
		dep, next := d[0], d[1]
		want := referenced(dep, s.tables[dep])
		if slices.Equal(want, s.names[next]) {
			continue
		}
		s.names[next] = want
		s.pending[next] = true
		s.lastChange = s.now()
		req := &discoveryv3.DiscoveryRequest{TypeUrl: next, ResourceNames: want}
		if prev := s.last[next]; prev != nil {
			req.VersionInfo, req.ResponseNonce = prev.GetVersionInfo(), prev.GetNonce()
		}
		out = append(out, req)
	}
	return out
}

// resourceName decodes a resource and returns the name it carries.
func resourceName(typ string, a *anypb.Any) (string, error) {
	m, err := decode(typ, a)
	if err != nil {
		return "", err
	}
	switch r := m.(type) {
	case *listenerv3.Listener:
		return r.GetName(), nil
	case *routev3.RouteConfiguration:
		return r.GetName(), nil
	case *clusterv3.Cluster:
		return r.GetName(), nil
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName(), nil
	}
	return "", fmt.Errorf("unexpected %T", m)
}

// referenced returns the names of the next type that the resources of
// type typ name, sorted: a listener's route configuration, a route's
// clusters, an EDS cluster's service name.
func referenced(typ string, table map[string]*anypb.Any) []string {
	names := map[string]bool{}
	for _, a := range table {
		m, err := decode(typ, a)
		if err != nil {
			continue
		}
		switch r := m.(type) {
		case *listenerv3.Listener:
			var hcm hcmv3.HttpConnectionManager
			if r.GetApiListener().GetApiListener().UnmarshalTo(&hcm) == nil && hcm.GetRds() != nil {
				names[hcm.GetRds().GetRouteConfigName()] = true
			}
			// A sidecar's listeners hold their connection managers in
			// filter chains.
			for _, fc := range append(slices.Clone(r.GetFilterChains()), r.GetDefaultFilterChain()) {
				for _, f := range fc.GetFilters() {
					var hcm hcmv3.HttpConnectionManager
					if f.GetTypedConfig().UnmarshalTo(&hcm) == nil && hcm.GetRds() != nil {
						names[hcm.GetRds().GetRouteConfigName()] = true
					}
				}
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

// quietFor reports whether every request of the subscriber has been
// answered and it has seen no change for d; it fails once the stream
// has ended or it has NACKed.
func (s *sotwSubscriber) quietFor(d time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false, s.err
	}
	if len(s.nacks) > 0 {
		return false, fmt.Errorf("%s: rejected a response: %s", s.name, s.nacks[0])
	}
	for _, typ := range envoyTypes {
		if s.pending[typ] {
			return false, nil
		}
	}
	return s.now().Sub(s.lastChange) >= d, nil
}

// table returns a copy of what the subscriber holds of one type.
func (s *sotwSubscriber) table(typ string) map[string]*anypb.Any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.tables[typ])
}
