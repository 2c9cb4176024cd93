package xds_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// BenchmarkReconnectAfterRestart: a node proxy that holds all 10,000
// pods reconnects, with initial_resource_versions, to a new server (a
// restarted controller) before that server has loaded its tables, as a
// proxy retrying every few milliseconds does while the informers list.
// The tables are then loaded and the proxy's first response read.
// Reported per reconnect: resources sent and removed (istiod sends none
// for an unchanged mesh, and neither must this), and the time from the
// tables' loading to the first response, which is the cost of a restart
// to a proxy that lost nothing.
func BenchmarkReconnectAfterRestart(b *testing.B) {
	src := &source{rounds: map[int]int{}}
	held := map[string]string{}
	for _, name := range src.AddressNames() {
		r, err := xds.NewResource(workloadapi.AddressTypeURL, name, src.Address(name))
		if err != nil {
			b.Fatal(err)
		}
		held[name] = r.Version
	}
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "istio-system", "NODE_NAME": "node-1"})
	if err != nil {
		b.Fatal(err)
	}
	node := &corev3.Node{Id: "ztunnel~10.0.0.1~ztunnel-0.istio-system~istio-system.svc.cluster.local", Metadata: md}
	var sent, removed int
	var toFirst time.Duration
	for b.Loop() {
		b.StopTimer()
		s, err := xds.New(xds.Config{Quiet: time.Millisecond, MaxDelay: time.Millisecond, MaxStreamsPerCaller: -1, StreamsPerSecond: -1},
			src, allowAll{}, slog.New(slog.DiscardHandler))
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
		go func() { _ = s.Run(ctx, synced) }()
		go func() { _ = g.Serve(lis) }()
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(200<<20)))
		if err != nil {
			b.Fatal(err)
		}
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: workloadapi.AddressTypeURL, InitialResourceVersions: held}); err != nil {
			b.Fatal(err)
		}
		// The stream is open on the server before its tables load.
		for !slices.ContainsFunc(s.Status(), func(ps xds.ProxyStatus) bool { return ps.ProxyID == "ztunnel-0.istio-system" }) {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		t0 := time.Now()
		close(synced)
		resp, err := st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		toFirst += time.Since(t0)
		b.StopTimer()
		sent += len(resp.GetResources())
		removed += len(resp.GetRemovedResources())
		cancel()
		cc.Close()
		g.Stop()
		b.StartTimer()
	}
	b.ReportMetric(float64(sent)/float64(b.N), "sent/reconnect")
	b.ReportMetric(float64(removed)/float64(b.N), "removed/reconnect")
	b.ReportMetric(float64(toFirst.Milliseconds())/float64(b.N), "ms-to-first-response")
}
