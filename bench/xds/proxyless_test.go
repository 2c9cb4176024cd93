package xds_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	networkingapi "istio.io/api/networking/v1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/sidecar/sidecartest"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// meshSource serves sidecartest's mesh of 1,000 Services and 10,000
// endpoints as both the workload tables and the proxyless clients'
// inputs; moveEndpoint and reweigh change one endpoint or one
// VirtualService.
type meshSource struct {
	mu sync.Mutex
	in sidecar.Inputs
}

func newMeshSource() *meshSource { return &meshSource{in: sidecartest.Mesh(1000, 10)} }

func (s *meshSource) SidecarInputs() sidecar.Inputs {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.in
	in.Addresses = slices.Clone(in.Addresses)
	in.VirtualServices = slices.Clone(in.VirtualServices)
	return in
}

func (s *meshSource) Address(string) *workloadapi.Address          { return nil }
func (s *meshSource) AddressNames() []string                       { return nil }
func (s *meshSource) Authorization(string) *security.Authorization { return nil }
func (s *meshSource) AuthorizationNames() []string                 { return nil }

// moveEndpoint gives the first endpoint of svc-0 a new address.
func (s *meshSource) moveEndpoint(round int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range s.in.Addresses {
		if w := a.GetWorkload(); w != nil && w.GetName() == "svc-0-0" {
			w = proto.Clone(w).(*workloadapi.Workload)
			w.Addresses = [][]byte{netip.AddrFrom4([4]byte{10, 200, byte(round >> 8), byte(round)}).AsSlice()}
			s.in.Addresses[i] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
			return w.GetUid()
		}
	}
	panic("no svc-0-0")
}

// reweigh changes svc-0's VirtualService split.
func (s *meshSource) reweigh(round int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, vs := range s.in.VirtualServices {
		if vs.Name == "svc-0" {
			vs = vs.DeepCopy()
			w := int32(1 + round%98)
			vs.Spec.Http[0].Route = []*networkingapi.HTTPRouteDestination{
				{Destination: &networkingapi.Destination{Host: "svc-0", Subset: "v0"}, Weight: w},
				{Destination: &networkingapi.Destination{Host: "svc-0", Subset: "v1"}, Weight: 100 - w},
			}
			s.in.VirtualServices[i] = vs
			return
		}
	}
	panic("no VirtualService svc-0")
}

// namespaceToken authenticates a caller whose token is its namespace.
type namespaceToken struct{}

func (namespaceToken) Authenticate(_ context.Context, token, _ string) (authn.Caller, error) {
	return authn.Caller{Cluster: "Kubernetes", Namespace: token, ServiceAccount: "client"}, nil
}

type proxylessBench struct {
	src    *meshSource
	server *xds.Server
	addr   string
}

func startProxyless(b *testing.B) *proxylessBench {
	b.Helper()
	src := newMeshSource()
	s, addr := serve(b, xds.Config{Mesh: src}, src, namespaceToken{})
	return &proxylessBench{src: src, server: s, addr: addr}
}

// grpcClient is a raw state-of-the-world stream that asks as grpc-go
// does: listeners for the 10 Services it calls, then the routes and
// clusters they name, then the clusters' endpoints; it ACKs everything
// and reports each response's type once synced.
type grpcClient struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	synced chan struct{}
	got    chan string
	// ended is closed, with err set, when the stream ends.
	ended chan struct{}
	err   error
}

// wait blocks until the client is synced, failing b if its stream ends
// first.
func (c *grpcClient) wait(b *testing.B) {
	select {
	case <-c.synced:
	case <-c.ended:
		b.Fatalf("stream ended before the client synced: %v", c.err)
	}
}

func (bn *proxylessBench) connect(b *testing.B, k int) *grpcClient {
	cc, err := grpc.NewClient(bn.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	ns := fmt.Sprintf("ns-%d", k%10)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+ns))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": ns})
	node := &corev3.Node{Id: fmt.Sprintf("sidecar~10.250.0.%d~client-%d.%s~%s.svc.cluster.local", k%250, k, ns, ns), Metadata: md}
	var listeners []string
	for i := k % 10; i < 100; i += 10 {
		listeners = append(listeners, fmt.Sprintf("svc-%d.%s.svc.cluster.local:8080", i, ns))
	}
	c := &grpcClient{conn: cc, cancel: cancel, synced: make(chan struct{}), got: make(chan string, 64), ended: make(chan struct{})}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: sidecar.ListenerType, ResourceNames: listeners}); err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(c.ended)
		acked := map[string]bool{}
		names := map[string][]string{sidecar.ListenerType: listeners}
		for {
			resp, err := st.Recv()
			if err != nil {
				c.err = err
				return
			}
			typ := resp.GetTypeUrl()
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo(), ResourceNames: names[typ]}); err != nil {
				return
			}
			var next []string
			nextType := ""
			switch typ {
			case sidecar.ListenerType:
				for _, l := range listeners {
					host, _, _ := net.SplitHostPort(l)
					next = append(next, sidecar.ClusterName(sidecar.Outbound, 8080, "", host))
				}
				nextType = sidecar.RouteType
			case sidecar.RouteType:
				for _, r := range resp.GetResources() {
					var rc routev3.RouteConfiguration
					_ = r.UnmarshalTo(&rc)
					for _, vh := range rc.GetVirtualHosts() {
						for _, rt := range vh.GetRoutes() {
							if c := rt.GetRoute().GetCluster(); c != "" {
								next = append(next, c)
							}
							for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
								next = append(next, wc.GetName())
							}
						}
					}
				}
				nextType = sidecar.ClusterType
			case sidecar.ClusterType:
				for _, r := range resp.GetResources() {
					var cl clusterv3.Cluster
					_ = r.UnmarshalTo(&cl)
					next = append(next, cl.GetName())
				}
				nextType = sidecar.EndpointType
			}
			if nextType != "" && !acked[typ] {
				names[nextType] = next
				if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: nextType, ResourceNames: next}); err != nil {
					return
				}
			}
			first := !acked[typ]
			acked[typ] = true
			if first && len(acked) == 4 {
				close(c.synced)
				continue
			}
			if len(acked) == 4 && !first {
				c.got <- typ
			}
		}
	}()
	return c
}

func (c *grpcClient) close() { c.cancel(); c.conn.Close() }

// BenchmarkProxylessInitialPush: 100 proxyless clients, each calling 10
// of 1,000 Services (10,000 endpoints), connect and walk listeners,
// routes, clusters and endpoints until all four are ACKed. Reported:
// server and stream heap per client.
func BenchmarkProxylessInitialPush(b *testing.B) {
	bn := startProxyless(b)
	const n = 100
	var perClient float64
	for b.Loop() {
		before := heapInUse()
		clients := make([]*grpcClient, n)
		for i := range clients {
			clients[i] = bn.connect(b, i)
		}
		for _, c := range clients {
			c.wait(b)
		}
		b.StopTimer()
		perClient = float64(heapInUse()-before) / n
		for _, c := range clients {
			c.close()
		}
		b.StartTimer()
	}
	b.ReportMetric(perClient, "heap-bytes/client")
}

// BenchmarkProxylessChange: with 100 clients synced, one endpoint of svc-0
// moves (or svc-0's VirtualService changes its split); time until each of
// the 10 clients that call svc-0 received the new endpoints (routes).
func BenchmarkProxylessChange(b *testing.B) {
	for _, tc := range []struct {
		name, typ string
		change    func(bn *proxylessBench, round int) index.ChangeSet
	}{
		{"endpoint", sidecar.EndpointType, func(bn *proxylessBench, round int) index.ChangeSet {
			return index.ChangeSet{Addresses: index.Changes{Updated: []string{bn.src.moveEndpoint(round)}}}
		}},
		{"virtualservice", sidecar.RouteType, func(bn *proxylessBench, round int) index.ChangeSet {
			bn.src.reweigh(round)
			return index.ChangeSet{SidecarInputs: true}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bn := startProxyless(b)
			clients := make([]*grpcClient, 100)
			for i := range clients {
				clients[i] = bn.connect(b, i)
			}
			for _, c := range clients {
				c.wait(b)
			}
			defer func() {
				for _, c := range clients {
					c.close()
				}
			}()
			round := 0
			for b.Loop() {
				round++
				bn.server.Changed(tc.change(bn, round))
				for i := 0; i < len(clients); i += 10 { // the clients of ns-0
					for typ := range clients[i].got {
						if typ == tc.typ {
							break
						}
					}
				}
			}
		})
	}
}
