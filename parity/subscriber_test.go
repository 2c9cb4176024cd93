package parity

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// types are the two workload xDS types a node proxy subscribes to, in the
// order ztunnel sends them.
var types = []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL}

// subscriber is a wildcard Delta ADS client of both types that keeps what
// it was sent, as ztunnel would, without interpreting it. It is safe for
// concurrent use.
type subscriber struct {
	name string
	now  func() time.Time

	mu         sync.Mutex
	tables     map[string]map[string]*anypb.Any // type URL → name → resource
	responses  map[string]int                   // type URL → responses received
	lastChange time.Time
	err        error // why the stream ended, if it did
}

// ztunnelNode is the node a ztunnel of node node-1 in namespace ns sends.
func ztunnelNode(ns, pod, ip string) (*corev3.Node, error) {
	md, err := structpb.NewStruct(map[string]any{
		"NAME": pod, "NAMESPACE": ns, "NODE_NAME": "node-1", "INSTANCE_IPS": ip,
		"CLUSTER_ID": "Kubernetes", "SERVICE_ACCOUNT": "ztunnel",
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns), Metadata: md}, nil
}

// subscribe opens the stream, sends the initial request of each type and
// acknowledges every response until ctx ends.
func subscribe(ctx context.Context, name string, conn *grpc.ClientConn, node *corev3.Node, md metadata.MD) (*subscriber, error) {
	s := &subscriber{name: name, now: time.Now, tables: map[string]map[string]*anypb.Any{}, responses: map[string]int{}}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", name, err)
	}
	for _, typ := range types {
		s.tables[typ] = map[string]*anypb.Any{}
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typ}); err != nil {
			return nil, fmt.Errorf("subscribe %s to %s: %w", name, typ, err)
		}
	}
	go func() {
		err := s.run(stream)
		s.mu.Lock()
		defer s.mu.Unlock()
		if ctx.Err() == nil {
			s.err = err
		}
	}()
	return s, nil
}

func (s *subscriber) run(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("%s stream: %w", s.name, err)
		}
		s.apply(resp)
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			return fmt.Errorf("%s ACK: %w", s.name, err)
		}
	}
}

func (s *subscriber) apply(resp *discoveryv3.DeltaDiscoveryResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	table := s.tables[resp.GetTypeUrl()]
	if table == nil {
		return // a type not asked for
	}
	s.responses[resp.GetTypeUrl()]++
	changed := false
	for _, r := range resp.GetResources() {
		if old, ok := table[r.GetName()]; !ok || !proto.Equal(old, r.GetResource()) {
			table[r.GetName()] = r.GetResource()
			changed = true
		}
	}
	for _, name := range resp.GetRemovedResources() {
		if _, ok := table[name]; ok {
			delete(table, name)
			changed = true
		}
	}
	if changed {
		s.lastChange = s.now()
	}
}

// quietFor reports whether the subscriber has a response of each type and
// has seen no change for d; it fails once the stream has ended.
func (s *subscriber) quietFor(d time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false, s.err
	}
	for _, typ := range types {
		if s.responses[typ] == 0 {
			return false, nil
		}
	}
	return s.now().Sub(s.lastChange) >= d, nil
}

// table returns a copy of what the subscriber holds of one type.
func (s *subscriber) table(typ string) map[string]*anypb.Any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*anypb.Any, len(s.tables[typ]))
	for k, v := range s.tables[typ] {
		out[k] = v
	}
	return out
}
