// Package xds_test benchmarks the workload xDS server over real gRPC on
// loopback: 10,000 pods, 1 and 100 proxies. Run it with
//
//	go test ./bench/xds -run '^$' -bench . -benchtime 20x
//
// Proxies here are raw Delta streams that ACK and discard, so the figures
// are the server's (and gRPC's), not a client table's.
package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

const pods = 10000

// source is a mesh of pods shaped like the builders' output: one IP, a
// service, identity, locality; round changes one pod.
type source struct {
	mu     sync.Mutex
	rounds map[int]int
}

func uid(i int) string {
	return fmt.Sprintf("Kubernetes//Pod/ns-%d/app-%d-7f9c8d6b5-x%04d", i%50, i%200, i)
}

func (s *source) Address(name string) *workloadapi.Address {
	var i int
	if _, err := fmt.Sscanf(name[len(name)-4:], "%04d", &i); err != nil {
		return nil
	}
	s.mu.Lock()
	r := s.rounds[i]
	s.mu.Unlock()
	ns := fmt.Sprintf("ns-%d", i%50)
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: name, Name: fmt.Sprintf("app-%d-7f9c8d6b5-x%04d", i%200, i), Namespace: ns,
		Addresses: [][]byte{{10, byte(244 + i/65536), byte(i >> 8), byte(i)}}, ServiceAccount: fmt.Sprintf("app-%d", i%200),
		Node: fmt.Sprintf("node-%d", i%100), CanonicalName: fmt.Sprintf("app-%d", i%200), CanonicalRevision: fmt.Sprintf("v%d", r),
		WorkloadName: fmt.Sprintf("app-%d", i%200), TrustDomain: "cluster.local", ClusterId: "Kubernetes",
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY,
		Locality: &workloadapi.Locality{Region: "region-1", Zone: "zone-a"},
		Services: map[string]*workloadapi.PortList{
			workloadapi.ServiceKey(ns, fmt.Sprintf("app-%d.%s.svc.cluster.local", i%200, ns)): {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
		},
	}}}
}

func (s *source) AddressNames() []string {
	out := make([]string, pods)
	for i := range out {
		out[i] = uid(i)
	}
	return out
}
func (s *source) Authorization(string) *security.Authorization { return nil }
func (s *source) AuthorizationNames() []string                 { return nil }

func (s *source) change(i int) string {
	s.mu.Lock()
	s.rounds[i]++
	s.mu.Unlock()
	return uid(i)
}

type allowAll struct{}

func (allowAll) Authenticate(context.Context, string, string) (authn.Caller, error) {
	return authn.Caller{Cluster: "Kubernetes", Namespace: "istio-system", ServiceAccount: "ztunnel"}, nil
}

type bench struct {
	src    *source
	server *xds.Server
	addr   string
}

func start(b *testing.B) *bench {
	b.Helper()
	src := &source{rounds: map[int]int{}}
	// Every proxy here is one caller (allowAll).
	s, addr := serve(b, xds.Config{}, src, allowAll{})
	return &bench{src: src, server: s, addr: addr}
}

// serve runs an xDS server over source on a loopback port until the
// benchmark ends, with a 1ms debounce (the figures are the pipeline's,
// not the quiet period's) and no stream limits (every client connects at
// once), and returns it once its tables are loaded.
func serve(b *testing.B, cfg xds.Config, source xds.Source, auth xds.Authenticator) (*xds.Server, string) {
	b.Helper()
	cfg.Quiet, cfg.MaxDelay, cfg.MaxStreamsPerCaller, cfg.StreamsPerSecond = time.Millisecond, time.Millisecond, -1, -1
	s, err := xds.New(cfg, source, auth, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan struct{})
	close(synced)
	go func() { _ = s.Run(ctx, synced) }()
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(func() { cancel(); g.Stop() })
	<-s.Ready()
	return s, lis.Addr().String()
}

// proxy is a raw Delta stream that ACKs every response and reports the
// arrival of watched names.
type proxy struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	synced chan struct{}
	bytes  int
	seen   chan string
	mu     sync.Mutex
	watch  string
}

func (bn *bench) connect(b *testing.B, i int) *proxy {
	cc, err := grpc.NewClient(bn.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(200<<20)))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "istio-system", "NODE_NAME": fmt.Sprintf("node-%d", i%100)})
	node := &corev3.Node{Id: fmt.Sprintf("ztunnel~10.0.0.1~ztunnel-%d.istio-system~istio-system.svc.cluster.local", i), Metadata: md}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: workloadapi.AddressTypeURL}); err != nil {
		b.Fatal(err)
	}
	p := &proxy{conn: cc, cancel: cancel, synced: make(chan struct{}), seen: make(chan string, 16)}
	go func() {
		for first := true; ; first = false {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			if first {
				p.bytes = proto.Size(resp)
			}
			if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				return
			}
			if first {
				close(p.synced)
				continue
			}
			p.mu.Lock()
			w := p.watch
			p.mu.Unlock()
			for _, r := range resp.GetResources() {
				if r.GetName() == w {
					p.seen <- w
				}
			}
		}
	}()
	return p
}

func (p *proxy) close() { p.cancel(); p.conn.Close() }

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// BenchmarkInitialPush: connect N proxies to a 10,000-pod table and wait
// until every one has its first full response and ACKed it. Reported:
// bytes of one full response, server+stream heap per proxy, and (the
// baseline) the time to marshal one full response once.
func BenchmarkInitialPush(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("proxies=%d", n), func(b *testing.B) {
			bn := start(b)
			var bytes int
			var perProxy float64
			for b.Loop() {
				before := heapInUse()
				proxies := make([]*proxy, n)
				for i := range proxies {
					proxies[i] = bn.connect(b, i)
				}
				for _, p := range proxies {
					<-p.synced
				}
				b.StopTimer()
				perProxy = float64(heapInUse()-before) / float64(n)
				bytes = proxies[0].bytes
				for _, p := range proxies {
					p.close()
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(bytes), "response-bytes")
			b.ReportMetric(perProxy, "heap-bytes/proxy")
		})
	}
}

// BenchmarkMarshalFullResponse is the baseline of BenchmarkInitialPush:
// serializing one full 10,000-pod response, the least a push can cost.
func BenchmarkMarshalFullResponse(b *testing.B) {
	src := &source{rounds: map[int]int{}}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: workloadapi.AddressTypeURL}
	for _, name := range src.AddressNames() {
		r, err := xds.NewResource(workloadapi.AddressTypeURL, name, src.Address(name))
		if err != nil {
			b.Fatal(err)
		}
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: r.Name, Version: r.Version, Resource: r.Body})
	}
	for b.Loop() {
		if _, err := proto.Marshal(resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChangeToAllACKed: one pod changes in the index; time until every
// proxy has received it and ACKed. Reported: p50 and p99 over iterations;
// proxies=1 is the baseline.
func BenchmarkChangeToAllACKed(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("proxies=%d", n), func(b *testing.B) {
			bn := start(b)
			proxies := make([]*proxy, n)
			for i := range proxies {
				proxies[i] = bn.connect(b, i)
			}
			for _, p := range proxies {
				<-p.synced
			}
			defer func() {
				for _, p := range proxies {
					p.close()
				}
			}()
			var took []time.Duration
			i := 0
			for b.Loop() {
				i++
				name := uid(i % pods)
				for _, p := range proxies {
					p.mu.Lock()
					p.watch = name
					p.mu.Unlock()
				}
				t0 := time.Now()
				bn.server.Changed(index.ChangeSet{Addresses: index.Changes{Updated: []string{bn.src.change(i % pods)}}})
				for _, p := range proxies {
					<-p.seen
				}
				took = append(took, time.Since(t0))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}
