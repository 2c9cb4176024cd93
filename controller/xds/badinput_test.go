package xds_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// firstError opens a Delta stream with headers, sends reqs and returns
// the status the stream ends with.
func firstError(t *testing.T, addr string, headers []string, reqs ...*discoveryv3.DeltaDiscoveryRequest) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, headers...)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, addr)).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, r := range reqs {
		if err := st.Send(r); err != nil {
			break
		}
	}
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// TestBadInput: each bad stream gets a clear status, and a proxy beside
// them keeps working.
func TestBadInput(t *testing.T) {
	m := startMesh(t, xds.Config{})
	good := m.connect(t, "ztunnel-good", "node-1", proxyOptions{})
	tok := m.token(t)
	auth := []string{"authorization", "Bearer " + tok}
	addrReq := func(n *corev3.Node) *discoveryv3.DeltaDiscoveryRequest {
		return &discoveryv3.DeltaDiscoveryRequest{Node: n, TypeUrl: workloadapi.AddressTypeURL}
	}
	// A node of another namespace, presented with this namespace's token.
	wrongNode := (&mesh{ns: env.Namespace(t, "intruder", nil)}).node(t, "ztunnel-x", "")
	huge := map[string]string{}
	for i := range 60000 {
		huge[fmt.Sprintf("Kubernetes//Pod/ns/pod-%06d-%s", i, strings.Repeat("x", 40))] = "1"
	}
	for _, tt := range []struct {
		name    string
		headers []string
		reqs    []*discoveryv3.DeltaDiscoveryRequest
		code    codes.Code
		msg     string
	}{
		{"no token", nil, []*discoveryv3.DeltaDiscoveryRequest{addrReq(m.node(t, "z", ""))}, codes.Unauthenticated, "no bearer token"},
		{"wrong token", []string{"authorization", "Bearer nonsense"}, []*discoveryv3.DeltaDiscoveryRequest{addrReq(m.node(t, "z", ""))}, codes.Unauthenticated, "authentication failed"},
		// The token is checked from the stream's headers before any
		// request is read: a caller without a valid token never gets the
		// server to buffer a (up to 16 MiB) message.
		{"wrong token, no request sent", []string{"authorization", "Bearer nonsense"}, nil, codes.Unauthenticated, "authentication failed"},
		{"no token, no request sent", nil, nil, codes.Unauthenticated, "no bearer token"},
		{"unknown cluster", append([]string{"clusterid", "elsewhere"}, auth...), []*discoveryv3.DeltaDiscoveryRequest{addrReq(m.node(t, "z", ""))}, codes.Unauthenticated, "unknown cluster"},
		{"malformed node ID", auth, []*discoveryv3.DeltaDiscoveryRequest{addrReq(&corev3.Node{Id: "ztunnel~nope"})}, codes.InvalidArgument, "want 4 parts"},
		{"no node", auth, []*discoveryv3.DeltaDiscoveryRequest{{TypeUrl: workloadapi.AddressTypeURL}}, codes.InvalidArgument, "no node ID"},
		{"identity of another namespace", auth, []*discoveryv3.DeltaDiscoveryRequest{addrReq(wrongNode)}, codes.PermissionDenied, "may not act for a proxy in namespace"},
		{"unknown type", auth, []*discoveryv3.DeltaDiscoveryRequest{{Node: m.node(t, "z", ""), TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}}, codes.InvalidArgument, "unsupported type URL"},
		{"bare Workload type", auth, []*discoveryv3.DeltaDiscoveryRequest{{Node: m.node(t, "z", ""), TypeUrl: workloadapi.WorkloadTypeURL}}, codes.InvalidArgument, "unsupported type URL"},
		{"oversized request", auth, []*discoveryv3.DeltaDiscoveryRequest{{Node: m.node(t, "z", ""), TypeUrl: workloadapi.AddressTypeURL, InitialResourceVersions: huge}}, codes.ResourceExhausted, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := firstError(t, m.addr, tt.headers, tt.reqs...)
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("stream ended with %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}

	// A NACK storm: thousands of rejections on one stream; the good proxy
	// still follows a change.
	ctx := metadata.AppendToOutgoingContext(t.Context(), auth...)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(addrReq(m.node(t, "ztunnel-storm", ""))); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for range 5000 {
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: workloadapi.AddressTypeURL, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "no"}}); err != nil {
			t.Fatal(err)
		}
	}
	ns := env.Namespace(t, "apps", nil)
	uid := ambientPod(t, ns, "during-storm", "node-1", "10.244.6.10", nil)
	eventually.Within(t, settle, "good proxy unaffected by the storm", func() bool { return good.table.Workload(uid) != nil })
}

// fakeSource is a generated table; the slow-proxy test needs a large one
// that changes often, without creating thousands of pods.
type fakeSource struct {
	mu    sync.Mutex
	round int
	n     int
}

func (f *fakeSource) name(i int) string { return fmt.Sprintf("Kubernetes//Pod/ns/pod-%d", i) }

func (f *fakeSource) Address(n string) *workloadapi.Address {
	f.mu.Lock()
	defer f.mu.Unlock()
	var i int
	if _, err := fmt.Sscanf(n, "Kubernetes//Pod/ns/pod-%d", &i); err != nil || i >= f.n {
		return nil
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: n, Name: fmt.Sprintf("pod-%d", i), Namespace: "ns", Addresses: [][]byte{{10, 1, byte(i >> 8), byte(i)}},
		Node: fmt.Sprintf("node-%d-%s", f.round, strings.Repeat("n", 200)),
	}}}
}

// next changes every address and returns their names.
func (f *fakeSource) next() []string {
	f.mu.Lock()
	f.round++
	f.mu.Unlock()
	return f.AddressNames()
}

func (f *fakeSource) Authorization(string) *security.Authorization { return nil }
func (f *fakeSource) AuthorizationNames() []string                 { return nil }
func (f *fakeSource) AddressNames() []string {
	out := make([]string, f.n)
	for i := range out {
		out[i] = f.name(i)
	}
	return out
}

// TestSlowProxyIsCutOff: a proxy that never reads is disconnected after
// the send timeout, and another proxy is served meanwhile.
func TestSlowProxyIsCutOff(t *testing.T) {
	testenv.Need(t, env)
	src := &fakeSource{n: 4000}
	m := newMesh(t, xds.Config{SendTimeout: 500 * time.Millisecond}, src)
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)

	// A small fixed window, so the ~1 MB first response cannot be buffered.
	slow := dial(t, m.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	sctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(slow).DeltaAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: m.node(t, "ztunnel-slow", ""), TypeUrl: workloadapi.AddressTypeURL}); err != nil {
		t.Fatal(err)
	}
	fast := m.connect(t, "ztunnel-fast", "", proxyOptions{})
	if n := len(fast.table.Snapshot().Workloads); n != 4000 {
		t.Errorf("fast proxy holds %d workloads, want 4000", n)
	}
	// gRPC takes one response whatever its size; the next ones block on
	// the unread stream.
	for round := 1; round <= 3; round++ {
		m.server.Changed(index.ChangeSet{Addresses: index.Changes{Updated: src.next()}})
		node := fmt.Sprintf("node-%d-", round)
		eventually.Within(t, settle, "fast proxy follows", func() bool {
			return strings.HasPrefix(fast.table.Workload(src.name(0)).GetNode(), node)
		})
	}
	eventually.Within(t, settle, "slow proxy disconnected", func() bool {
		return testutil.ToFloat64(mustCounter(t, m, "canopy_xds_slow_proxies_disconnected_total")) == 1 && len(m.server.ConfigDumps("ztunnel-slow."+m.ns)) == 0
	})
}
