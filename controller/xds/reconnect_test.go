package xds_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestReconnectSkipsUnchanged: after a reconnect the proxy's held versions
// spare it every unchanged resource, and what vanished meanwhile arrives
// as a removal.
func TestReconnectSkipsUnchanged(t *testing.T) {
	m := startMesh(t, xds.Config{})
	ns := env.Namespace(t, "apps", nil)
	stay := ambientPod(t, ns, "stay", "node-1", "10.244.3.10", nil)
	gone := ambientPod(t, ns, "gone", "node-1", "10.244.3.11", nil)

	var mu sync.Mutex
	var responses []*discoveryv3.DeltaDiscoveryResponse
	p := &proxy{table: workloadtable.New()}
	rec := handlerFunc(func(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
		mu.Lock()
		responses = append(responses, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Resources: rs, RemovedResources: removed})
		mu.Unlock()
		return p.table.Apply(typeURL, rs, removed)
	})
	c := m.connect(t, "ztunnel-re", "node-1", proxyOptions{handler: rec})
	p.client = c.client
	eventually.Within(t, settle, "both pods held", func() bool { return p.table.Workload(stay) != nil && p.table.Workload(gone) != nil })
	held := p.client.Versions(workloadapi.AddressTypeURL)

	observer := m.connect(t, "ztunnel-observer", "node-1", proxyOptions{})
	c.stop()
	deletePod(t, ns, "gone")
	// The server drops the pod before the proxy is back.
	eventually.Within(t, settle, "server dropped the pod", func() bool { return observer.table.Workload(gone) == nil })
	mu.Lock()
	responses = nil
	mu.Unlock()
	c.run(t)
	eventually.Within(t, settle, "removal arrives", func() bool { return p.table.Workload(gone) == nil })

	mu.Lock()
	defer mu.Unlock()
	for _, r := range responses {
		for _, res := range r.Resources {
			if v, ok := held[res.GetName()]; ok && v == res.GetVersion() {
				t.Errorf("unchanged %s resent after reconnect", res.GetName())
			}
		}
	}
	if p.table.Workload(stay) == nil {
		t.Error("the unchanged pod was lost")
	}
}

// TestManyClientsConverge: 100 proxies on their own connections end with
// identical tables through creates, updates and deletes.
func TestManyClientsConverge(t *testing.T) {
	// The proxies share one token that is bound to no pod, so they are one
	// caller to the per-caller cap; real node proxies' tokens are their
	// pods'.
	m := startMesh(t, xds.Config{MaxStreamsPerCaller: -1})
	ns := env.Namespace(t, "apps", nil)
	const clients = 100
	proxies := make([]*proxy, clients)
	var wg sync.WaitGroup
	for i := range proxies {
		wg.Go(func() { proxies[i] = m.connect(t, fmt.Sprintf("ztunnel-%d", i), "node-1", proxyOptions{}) })
	}
	wg.Wait()
	for i := range 20 {
		ambientPod(t, ns, fmt.Sprintf("p%d", i), "node-1", fmt.Sprintf("10.244.4.%d", 10+i), nil)
	}
	for i := range 5 {
		setPodIP(t, ns, fmt.Sprintf("p%d", i), fmt.Sprintf("10.244.5.%d", 10+i))
	}
	for i := 15; i < 20; i++ {
		deletePod(t, ns, fmt.Sprintf("p%d", i))
	}
	last := workloadapi.PodUID("Kubernetes", ns, "p19")
	moved := workloadapi.PodUID("Kubernetes", ns, "p4")
	for _, p := range proxies {
		eventually.Within(t, settle, "every proxy converged", func() bool {
			return p.table.Workload(last) == nil && p.table.Has("/10.244.5.14") && p.table.Workload(moved) != nil
		})
	}
	// Only this test's workloads: the other tests of the package share the
	// API server and change theirs meanwhile.
	mine := func(p *proxy) []*workloadapi.Workload {
		var out []*workloadapi.Workload
		for _, w := range p.table.Snapshot().Workloads {
			if w.GetNamespace() == ns {
				out = append(out, w)
			}
		}
		return out
	}
	want := mine(proxies[0])
	for i, p := range proxies[1:] {
		if diff := cmp.Diff(want, mine(p), protocmp.Transform()); diff != "" {
			t.Fatalf("proxy %d differs from proxy 0 (-want +got):\n%s", i+1, diff)
		}
	}
}

// TestReconnectBeforeLoad: a proxy that reconnects holding everything
// before the server has loaded its tables (a restarted controller whose
// informers are still listing) waits, and is then sent nothing it holds
// and told to remove only what is truly gone.
func TestReconnectBeforeLoad(t *testing.T) {
	testenv.Need(t, env)
	src := &fakeSource{n: 200}
	m := newMesh(t, xds.Config{}, src)
	synced := make(chan struct{})
	m.run(t, synced)

	const gonePod, gonePolicy = "Kubernetes//Pod/ns/pod-999", "ns/gone"
	held := map[string]string{gonePod: "1"}
	for _, n := range src.AddressNames() {
		r, err := xds.NewResource(workloadapi.AddressTypeURL, n, src.Address(n))
		if err != nil {
			t.Fatal(err)
		}
		held[n] = r.Version
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := m.node(t, "ztunnel-early", "node-1")
	for _, req := range []*discoveryv3.DeltaDiscoveryRequest{
		{Node: node, TypeUrl: workloadapi.AddressTypeURL, InitialResourceVersions: held},
		{Node: node, TypeUrl: workloadapi.AuthorizationTypeURL, InitialResourceVersions: map[string]string{gonePolicy: "1"}},
	} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// The server has the stream, and its requests, before it has tables.
	eventually.Within(t, settle, "stream open", func() bool {
		return slices.ContainsFunc(m.server.Status(), func(ps xds.ProxyStatus) bool { return ps.ProxyID == "ztunnel-early."+m.ns })
	})
	close(synced)

	type response struct {
		Resources, Removed []string
	}
	got := map[string]response{}
	for range 2 {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		r := response{Removed: resp.GetRemovedResources()}
		for _, res := range resp.GetResources() {
			r.Resources = append(r.Resources, res.GetName())
		}
		got[resp.GetTypeUrl()] = r
	}
	want := map[string]response{
		workloadapi.AddressTypeURL:       {Removed: []string{gonePod}},
		workloadapi.AuthorizationTypeURL: {Removed: []string{gonePolicy}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("first responses after the tables loaded (-want +got):\n%s", diff)
	}
}
