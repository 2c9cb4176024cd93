package xds_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// proxylessStream is a state-of-the-world stream of a proxyless gRPC
// client; its responses arrive on in until the stream ends, then err is
// its status.
type proxylessStream struct {
	*sotw
	node   *corev3.Node
	cancel context.CancelFunc
	err    error
}

// proxylessAs opens a proxyless client's stream as service account sa
// with its token.
func (m *mesh) proxylessAs(t *testing.T, token, sa, pod string) *proxylessStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": m.ns, "SERVICE_ACCOUNT": sa})
	if err != nil {
		t.Fatal(err)
	}
	p := &proxylessStream{
		sotw:   &sotw{t: t, st: st, in: make(chan *discoveryv3.DiscoveryResponse, 4)},
		node:   &corev3.Node{Id: fmt.Sprintf("sidecar~10.9.9.9~%s.%s~%s.svc.cluster.local", pod, m.ns, m.ns), Metadata: md},
		cancel: cancel,
	}
	go func() {
		defer close(p.in)
		for {
			r, err := st.Recv()
			if err != nil {
				p.err = err
				return
			}
			p.in <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range p.in {
		}
	})
	return p
}

// ask sends a request for names of typ and returns its answer, or the
// stream's end.
func (p *proxylessStream) ask(typ string, names []string) (*discoveryv3.DiscoveryResponse, error) {
	p.t.Helper()
	if err := p.st.Send(&discoveryv3.DiscoveryRequest{Node: p.node, TypeUrl: typ, ResourceNames: names}); err != nil {
		for range p.in {
		}
		return nil, p.err
	}
	select {
	case r, ok := <-p.in:
		if !ok {
			return nil, p.err
		}
		return r, nil
	case <-time.After(30 * time.Second):
		p.t.Fatalf("no answer to %d %s names in 30s", len(names), typ)
		return nil, nil
	}
}

// settledHeap is the heap in use once what is garbage, and what pools
// keep since the last collection, is collected.
func settledHeap() uint64 {
	runtime.GC()
	return liveHeap()
}

// TestMadeUpNamesCostOnlyTheirCaller is the attack: one caller's token
// opens the most streams it may (10) as proxyless gRPC clients, and on
// each subscribes made-up route and endpoint names (well-formed cluster
// names of services that do not exist, each answered with a
// placeholder). A name no service has must cost the controller little
// (its watch remembers the name, no generated resource is cached or
// held), and what one caller may make it hold is bounded: past its bound
// a request ends its stream with ResourceExhausted, counted. The heap
// grows by less than the bound, a client of another caller is served
// throughout, and the memory returns once the streams close.
func TestMadeUpNamesCostOnlyTheirCaller(t *testing.T) {
	testenv.Need(t, env)
	const (
		streams = xds.DefaultMaxStreamsPerCaller
		perType = 5000    // names per type and stream
		bound   = 8 << 20 // bytes of names per caller
	)
	m := startMesh(t, xds.Config{MaxNameBytesPerCaller: bound})
	ctx := t.Context()
	if _, err := env.Client.CoreV1().Services(m.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := "echo." + m.ns + ".svc.cluster.local"
	eventually.Within(t, settle, "the service in the tables", func() bool { return m.index.Address(m.ns+"/"+host) != nil })

	// A real client, of another service account: its route has the
	// service's virtual host.
	if _, err := env.Client.CoreV1().ServiceAccounts(m.ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "real"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	realToken, err := env.Token(ctx, m.ns, "real", testenv.TokenOptions{Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	real := m.proxylessAs(t, realToken, "real", "real-client")
	cluster := sidecar.ClusterName(sidecar.Outbound, 7070, "", host)
	served := func(when string) {
		t.Helper()
		start := time.Now()
		r, err := real.ask(sidecar.RouteType, []string{cluster})
		if err != nil {
			t.Fatalf("%s: the real client's stream ended: %v", when, err)
		}
		var rc routev3.RouteConfiguration
		if len(r.GetResources()) != 1 || r.GetResources()[0].UnmarshalTo(&rc) != nil || len(rc.GetVirtualHosts()) != 1 {
			t.Fatalf("%s: the real client got %d routes, want its route with one virtual host", when, len(r.GetResources()))
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: the real client waited %s for its route", when, took)
		}
	}
	served("before the attack")
	namesBefore := gauge(t, m, "canopy_xds_subscribed_name_bytes")
	heapBefore := settledHeap()

	// The attacker's streams, each first asking for the real route, so
	// that what the streams themselves cost is not counted as its names'.
	token := m.token(t)
	attack := make([]*proxylessStream, streams)
	for i := range attack {
		attack[i] = m.proxylessAs(t, token, "default", fmt.Sprintf("attacker-%d", i))
		if _, err := attack[i].ask(sidecar.RouteType, []string{cluster}); err != nil {
			t.Fatalf("attacker stream %d: %v", i, err)
		}
	}
	heapStreams := settledHeap()

	held, refused := 0, 0
	for i, p := range attack {
		var asked int
		for _, typ := range []string{sidecar.RouteType, sidecar.EndpointType} {
			names := make([]string, perType)
			for j := range names {
				names[j] = sidecar.ClusterName(sidecar.Outbound, 80, "", fmt.Sprintf("made-up-%02d-%05d.attacker.svc.cluster.local", i, j))
			}
			r, err := p.ask(typ, names)
			if err != nil {
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("stream %d: %s names refused with %v, want ResourceExhausted", i, typ, err)
				}
				// The stream is over, and with it what its names held.
				refused++
				asked = 0
				break
			}
			if n := len(r.GetResources()); n != perType {
				t.Fatalf("stream %d: %d placeholders for %d made-up %s names, want one each", i, n, perType, typ)
			}
			asked += perType
		}
		held += asked
	}
	served("during the attack")
	heapAttack := settledHeap()
	growth := int64(heapAttack) - int64(heapStreams)
	t.Logf("%d made-up names asked for over %d streams (%+.1f MiB of heap for the streams); %d held, %d streams refused; heap %+.1f MiB for the names (%.0f bytes a held name)",
		streams*2*perType, streams, float64(int64(heapStreams)-int64(heapBefore))/(1<<20), held, refused, float64(growth)/(1<<20), float64(growth)/float64(max(held, 1)))
	if refused == 0 || held == 0 {
		t.Errorf("%d names held and %d streams refused: want some of each past the caller's bound of %d bytes", held, refused, bound)
	}
	if got := testutil.ToFloat64(mustCounter(t, m, "canopy_xds_rejected_streams_total")); got != float64(refused) {
		t.Errorf("refusals counted %v times, want %d", got, refused)
	}
	if charged := gauge(t, m, "canopy_xds_subscribed_name_bytes") - namesBefore; charged <= 0 || charged > bound {
		t.Errorf("the caller's names are charged %v bytes, want some and at most %d", charged, bound)
	}
	// The race detector's allocations inflate heap figures.
	slack := int64(1)
	if raceBuild {
		slack = 3
	}
	if growth > bound*slack {
		t.Errorf("the heap grew by %.1f MiB for one caller's made-up names, want at most its bound (%.1f MiB)", float64(growth)/(1<<20), float64(bound)/(1<<20))
	}

	for _, p := range attack {
		p.cancel()
	}
	eventually.Within(t, settle, "the closed streams' names no longer charged", func() bool {
		return gauge(t, m, "canopy_xds_subscribed_name_bytes") == namesBefore
	})
	var after uint64
	eventually.Within(t, settle, "the heap back to before the attack", func() bool {
		after = settledHeap()
		return int64(after)-int64(heapBefore) < 2<<20*slack
	})
	t.Logf("heap after the streams closed: %+.1f MiB from before the attack", (float64(after)-float64(heapBefore))/(1<<20))
	served("after the attack")
}

// TestDeltaPlaceholdersSentOnce: over Delta, the placeholder of a name the
// mesh has nothing under is sent once, since it is not remembered: when
// the name is subscribed, and when the mesh stops having something under
// it; a response for another reason does not carry it again.
func TestDeltaPlaceholdersSentOnce(t *testing.T) {
	m := startMesh(t, xds.Config{})
	ctx := t.Context()
	if _, err := env.Client.CoreV1().Services(m.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{{Name: "http", Port: 7070}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := "echo." + m.ns + ".svc.cluster.local"
	eventually.Within(t, settle, "the service in the tables", func() bool { return m.index.Address(m.ns+"/"+host) != nil })
	real := sidecar.ClusterName(sidecar.Outbound, 7070, "", host)
	madeUp := func(i int) string {
		return sidecar.ClusterName(sidecar.Outbound, 80, "", fmt.Sprintf("made-up-%d.example.com", i))
	}

	d := m.deltaStream(t)
	expect := func(step string, want reply) {
		t.Helper()
		if diff := cmp.Diff(want, deltaReply(t, d.recv())); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step, diff)
		}
	}
	// Assignments without endpoints: their tag is "".
	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "client", "10.1.1.1", ""), TypeUrl: eds,
		ResourceNamesSubscribe: []string{real, madeUp(1)}})
	expect("the first answer", reply{Type: "EDS", Resources: res(real, "", madeUp(1), "")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{madeUp(2)}})
	expect("a name subscribed", reply{Type: "EDS", Resources: res(real, "", madeUp(2), "")})
	if err := env.Client.CoreV1().Services(m.ns).Delete(ctx, "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the service deleted", reply{Type: "EDS", Resources: res(real, "")})
	nothingFor(t, d, eds, "nothing changed since")
}

// TestOnDemandNamesChargedToCaller: a node proxy's on-demand names count
// against its caller's bound too; past it, its request ends the stream
// with ResourceExhausted, and a stream within it is served.
func TestOnDemandNamesChargedToCaller(t *testing.T) {
	testenv.Need(t, env)
	m := newMesh(t, xds.Config{MaxNameBytesPerCaller: 64 << 10}, &fakeSource{n: 1})
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)
	cc, tok := dial(t, m.addr), m.token(t)
	ask := func(pod string, n int) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tok), 20*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("made-up/10.99.%d.%d", i/256, i%256)
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: m.node(t, pod, ""), TypeUrl: workloadapi.AddressTypeURL, ResourceNamesSubscribe: names}); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		return err
	}
	// Each name is charged about 150 bytes: 100 fit, 1,000 do not.
	if err := ask("ztunnel-within", 100); err != nil {
		t.Fatalf("100 names: %v", err)
	}
	err := ask("ztunnel-past", 1000)
	wantRefused(t, err, "subscribed names")
	if got := testutil.ToFloat64(mustCounter(t, m, "canopy_xds_rejected_streams_total")); got != 1 {
		t.Errorf("refusals counted %v times, want 1", got)
	}
}
