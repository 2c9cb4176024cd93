package xds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// sotw is a raw state-of-the-world stream as a proxyless gRPC client
// opens it.
type sotw struct {
	t  *testing.T
	st grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	// in has every response, read by one goroutine.
	in chan *discoveryv3.DiscoveryResponse
}

func (m *mesh) proxyless(t *testing.T, pod string) *sotw {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &sotw{t: t, st: st, in: make(chan *discoveryv3.DiscoveryResponse, 16)}
	go func() {
		defer close(s.in)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			s.in <- r
		}
	}()
	return s
}

func (s *sotw) send(req *discoveryv3.DiscoveryRequest) {
	s.t.Helper()
	if err := s.st.Send(req); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sotw) recv() *discoveryv3.DiscoveryResponse {
	s.t.Helper()
	select {
	case r, ok := <-s.in:
		if !ok {
			s.t.Fatal("stream ended")
		}
		return r
	case <-time.After(20 * time.Second):
		s.t.Fatal("no response in 20s")
	}
	return nil
}

// quiet reports whether no response arrives within d.
func (s *sotw) quiet(d time.Duration) (*discoveryv3.DiscoveryResponse, bool) {
	select {
	case r := <-s.in:
		return r, false
	case <-time.After(d):
		return nil, true
	}
}

func names(resp *discoveryv3.DiscoveryResponse) []string {
	var out []string
	for _, r := range resp.GetResources() {
		switch r.GetTypeUrl() {
		case sidecar.ClusterType, sidecar.EndpointType, sidecar.ListenerType, sidecar.RouteType:
		default:
			panic("unexpected type " + r.GetTypeUrl())
		}
		out = append(out, r.GetTypeUrl()[len("type.googleapis.com/envoy.config."):])
	}
	return out
}

// TestProxylessAckRules: istiod's request rules over state-of-the-world
// ADS (sidecar wire contract §1.3): a first request is answered; an ACK
// with the same names is not; a stale nonce is ignored; a NACK is
// recorded (proxy status ERROR) and not answered; new names are; a new
// listener watch makes the next same-nonce route request answered (the
// warming rule); a change of the mesh pushes the types it changed.
func TestProxylessAckRules(t *testing.T) {
	m := startMesh(t, xds.Config{})
	ctx := t.Context()
	if _, err := env.Client.CoreV1().Services(m.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := "echo." + m.ns + ".svc.cluster.local"
	eventually.Within(t, settle, "the service in the tables", func() bool { return m.index.Address(m.ns+"/"+host) != nil })

	p := m.proxyless(t, "client")
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": m.ns, "SERVICE_ACCOUNT": "default"})
	node := &corev3.Node{Id: fmt.Sprintf("sidecar~10.9.9.9~client.%s~%s.svc.cluster.local", m.ns, m.ns), Metadata: md}
	lds := func(nonce, version string, ns ...string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: sidecar.ListenerType, ResponseNonce: nonce, VersionInfo: version, ResourceNames: ns}
	}
	rds := func(nonce string, ns ...string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{TypeUrl: sidecar.RouteType, ResponseNonce: nonce, ResourceNames: ns}
	}
	route := "outbound|7070||" + host

	p.send(lds("", "", "echo:7070"))
	l1 := p.recv()
	if diff := cmp.Diff([]string{"listener.v3.Listener"}, names(l1)); diff != "" {
		t.Fatalf("first listener response (-want +got):\n%s", diff)
	}
	p.send(lds(l1.Nonce, l1.VersionInfo, "echo:7070")) // ACK
	p.send(rds("", route))
	r1 := p.recv()
	if r1.GetTypeUrl() != sidecar.RouteType || len(r1.GetResources()) != 1 {
		t.Fatalf("after an ACK and a route request: %s with %d resources, want the route", r1.GetTypeUrl(), len(r1.GetResources()))
	}
	p.send(rds(r1.Nonce, route)) // ACK: nothing to say
	p.send(rds("stale", route))  // stale: ignored
	p.send(&discoveryv3.DiscoveryRequest{TypeUrl: sidecar.RouteType, ResponseNonce: r1.Nonce, ResourceNames: []string{route},
		ErrorDetail: &statuspb.Status{Code: 3, Message: "route rejected on purpose"}})
	if r, ok := p.quiet(500 * time.Millisecond); !ok {
		t.Fatalf("an ACK, a stale request and a NACK were answered: %v", r)
	}
	eventually.Within(t, settle, "the NACK in proxy status", func() bool {
		for _, ps := range m.server.Status() {
			for _, ts := range ps.Types {
				if ps.ProxyID == "client."+m.ns && ts.Type == "RDS" {
					return ts.Status == xds.Error && ts.NACK == "route rejected on purpose"
				}
			}
		}
		return false
	})

	// A new listener watch (a reconnecting client's first request) makes
	// the route watch answer its next same-nonce request.
	p.send(lds("", "", "echo:7070"))
	l2 := p.recv()
	p.send(lds(l2.Nonce, l2.VersionInfo, "echo:7070"))
	p.send(rds(r1.Nonce, route))
	if r2 := p.recv(); r2.GetTypeUrl() != sidecar.RouteType {
		t.Fatalf("warming: got %s, want the route again", r2.GetTypeUrl())
	} else {
		p.send(rds(r2.Nonce, route))
	}

	// A DestinationRule changes nothing a listener or route holds; a
	// second port changes the listener ("echo" asks for every port).
	p.send(lds(l2.Nonce, l2.VersionInfo, "echo"))
	l3 := p.recv()
	p.send(lds(l3.Nonce, l3.VersionInfo, "echo"))
	svc, err := env.Client.CoreV1().Services(m.ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "grpc-admin", Port: 7071})
	if _, err := env.Client.CoreV1().Services(m.ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l4 := p.recv()
	if l4.GetTypeUrl() != sidecar.ListenerType || len(l4.GetResources()) != 2 {
		t.Fatalf("after a port was added: %s with %d resources, want both listeners", l4.GetTypeUrl(), len(l4.GetResources()))
	}
}

// TestProxylessLimits: a proxyless client asking for more names than a
// connection may hold is refused with ResourceExhausted, one asking for
// a name longer than any resource's with InvalidArgument; a gateway or
// waypoint (router node, no GENERATOR "grpc") asking for an Envoy type
// is told it is not served.
func TestProxylessLimits(t *testing.T) {
	m := startMesh(t, xds.Config{MaxSubscriptions: 10})
	for _, tt := range []struct {
		name      string
		nodeType  string
		generator string
		names     int
		nameLen   int
		want      codes.Code
	}{
		{"too many names", "sidecar", "grpc", 11, 0, codes.ResourceExhausted},
		{"a huge name", "sidecar", "grpc", 1, 1 << 20, codes.InvalidArgument},
		{"a gateway or waypoint", "router", "", 1, 0, codes.Unimplemented},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := m.proxyless(t, "client")
			md, _ := structpb.NewStruct(map[string]any{"GENERATOR": tt.generator, "NAMESPACE": m.ns, "SERVICE_ACCOUNT": "default"})
			node := &corev3.Node{Id: fmt.Sprintf("%s~10.9.9.9~client.%s~%s.svc.cluster.local", tt.nodeType, m.ns, m.ns), Metadata: md}
			var names []string
			for i := range tt.names {
				names = append(names, fmt.Sprintf("svc-%d%s:80", i, strings.Repeat("x", tt.nameLen)))
			}
			p.send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: sidecar.ListenerType, ResourceNames: names})
			if r, ok := <-p.in; ok {
				t.Fatalf("answered: %v", r)
			}
			if _, err := p.st.Recv(); status.Code(err) != tt.want {
				t.Errorf("stream ended with %v, want %v", err, tt.want)
			}
		})
	}
}
