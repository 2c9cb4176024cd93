package xds

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func node(t testing.TB, id string, md map[string]any) *corev3.Node {
	t.Helper()
	s, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: id, Metadata: s}
}

func TestParseNode(t *testing.T) {
	t.Parallel()
	const ztunnelID = "ztunnel~10.244.1.3~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
	for _, tt := range []struct {
		name    string
		node    *corev3.Node
		want    Proxy
		wantErr string
	}{
		{
			name: "ztunnel",
			node: node(t, ztunnelID, map[string]any{
				"NAME": "ztunnel-abc", "NAMESPACE": "istio-system", "INSTANCE_IPS": "10.244.1.3,fd00::3",
				"NODE_NAME": "node-1", "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "1.26.0", "DNS_CAPTURE": "true",
			}),
			want: Proxy{
				ID: ztunnelID, Type: "ztunnel", IP: netip.MustParseAddr("10.244.1.3"), ProxyID: "ztunnel-abc.istio-system",
				Name: "ztunnel-abc", Namespace: "istio-system", DNSDomain: "istio-system.svc.cluster.local",
				NodeName: "node-1", ClusterID: "Kubernetes", IstioVersion: "1.26.0",
				InstanceIPs: []netip.Addr{netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00::3")},
			},
		},
		{
			name: "pod name with dots, namespace from the ID",
			node: node(t, "sidecar~10.0.0.1~a.b.c.ns1~ns1.svc.cluster.local", nil),
			want: Proxy{ID: "sidecar~10.0.0.1~a.b.c.ns1~ns1.svc.cluster.local", Type: "sidecar", IP: netip.MustParseAddr("10.0.0.1"),
				ProxyID: "a.b.c.ns1", Name: "a.b.c", Namespace: "ns1", DNSDomain: "ns1.svc.cluster.local"},
		},
		{name: "no node", node: nil, wantErr: "no node ID"},
		{name: "three parts", node: node(t, "ztunnel~1.2.3.4~p.ns", nil), wantErr: "want 4 parts"},
		{name: "unknown type", node: node(t, "envoy~1.2.3.4~p.ns~ns.svc.cluster.local", nil), wantErr: "unknown proxy type"},
		{name: "bad IP", node: node(t, "ztunnel~1.2.3~p.ns~ns.svc.cluster.local", nil), wantErr: "IP"},
		{name: "no namespace", node: node(t, "ztunnel~1.2.3.4~p~ns.svc.cluster.local", nil), wantErr: "not <pod>.<namespace>"},
		{name: "trailing dot", node: node(t, "ztunnel~1.2.3.4~p.~ns.svc.cluster.local", nil), wantErr: "not <pod>.<namespace>"},
		{name: "empty domain", node: node(t, "ztunnel~1.2.3.4~p.ns~", nil), wantErr: "empty DNS domain"},
		{name: "long ID", node: node(t, "ztunnel~1.2.3.4~p.ns~"+strings.Repeat("a", 1100), nil), wantErr: "limit 1024"},
		{
			name: "metadata wins over a placeholder ID (istioctl)",
			node: node(t, "sidecar~10.0.0.1~test-1.default~default.svc.cluster.local", map[string]any{"NAMESPACE": "istio-system", "GENERATOR": "event"}),
			want: Proxy{ID: "sidecar~10.0.0.1~test-1.default~default.svc.cluster.local", Type: "sidecar", IP: netip.MustParseAddr("10.0.0.1"),
				ProxyID: "test-1.default", Name: "test-1", Namespace: "istio-system", DNSDomain: "default.svc.cluster.local", Generator: "event"},
		},
		{
			name: "proxyless gRPC client with labels",
			node: node(t, "sidecar~10.0.0.2~echo-1.apps~apps.svc.cluster.local", map[string]any{
				"GENERATOR": "grpc", "SERVICE_ACCOUNT": "echo", "LABELS": map[string]any{"app": "echo", "version": "v1"},
			}),
			want: Proxy{ID: "sidecar~10.0.0.2~echo-1.apps~apps.svc.cluster.local", Type: "sidecar", IP: netip.MustParseAddr("10.0.0.2"),
				ProxyID: "echo-1.apps", Name: "echo-1", Namespace: "apps", DNSDomain: "apps.svc.cluster.local", ServiceAccount: "echo",
				Generator: "grpc", Labels: map[string]string{"app": "echo", "version": "v1"}},
		},
		{
			name:    "labels not an object",
			node:    node(t, "sidecar~1.2.3.4~p.ns~ns.svc.cluster.local", map[string]any{"LABELS": "app=echo"}),
			wantErr: "LABELS is not an object",
		},
		{
			name:    "label not a string",
			node:    node(t, "sidecar~1.2.3.4~p.ns~ns.svc.cluster.local", map[string]any{"LABELS": map[string]any{"replicas": 3}}),
			wantErr: `LABELS["replicas"] is not a string`,
		},
		{
			name:    "too many labels",
			node:    node(t, "sidecar~1.2.3.4~p.ns~ns.svc.cluster.local", map[string]any{"LABELS": manyLabels(300)}),
			wantErr: "LABELS has 300 keys, limit 256",
		},
		{
			name:    "metadata not a string",
			node:    node(t, "ztunnel~1.2.3.4~p.ns~ns.svc.cluster.local", map[string]any{"NODE_NAME": 3}),
			wantErr: "NODE_NAME is not a string",
		},
		{
			name:    "bad instance IP",
			node:    node(t, "ztunnel~1.2.3.4~p.ns~ns.svc.cluster.local", map[string]any{"INSTANCE_IPS": "1.2.3.4,x"}),
			wantErr: "INSTANCE_IPS",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseNode(tt.node)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrMalformedNode) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseNode() error = %v, want ErrMalformedNode containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.Metadata, tt.node.GetMetadata()) {
				t.Errorf("Metadata = %v, want the node's", got.Metadata)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Proxy{}, "Metadata"), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("ParseNode() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func manyLabels(n int) map[string]any {
	out := map[string]any{}
	for i := range n {
		out[fmt.Sprintf("label-%d", i)] = "v"
	}
	return out
}

func FuzzParseNode(f *testing.F) {
	f.Add("ztunnel~10.244.1.3~z.istio-system~istio-system.svc.cluster.local", "istio-system", "10.244.1.3")
	f.Add("sidecar~::1~a.b~b.svc", "", "")
	f.Fuzz(func(t *testing.T, id, ns, ips string) {
		n := &corev3.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"NAMESPACE": structpb.NewStringValue(ns), "INSTANCE_IPS": structpb.NewStringValue(ips),
		}}}
		p, err := ParseNode(n)
		if err != nil {
			if !errors.Is(err, ErrMalformedNode) {
				t.Fatalf("error %v does not wrap ErrMalformedNode", err)
			}
			return
		}
		if p.ID != id || (ns != "" && ns != p.Namespace) || p.Namespace == "" {
			t.Fatalf("inconsistent proxy %+v from %q", p, id)
		}
	})
}
