package sidecar

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

func names[T config](in []T) []string {
	var out []string
	for _, c := range in {
		out = append(out, c.GetNamespace()+"/"+c.GetName())
	}
	return out
}

// TestRuleLookup: which VirtualServices route a host for a client (oldest
// first, wildcards included, exportTo and gateways honoured) and which
// DestinationRule applies (the client's namespace, then the service's,
// then any other).
func TestRuleLookup(t *testing.T) {
	vs := func(ns, name string, age time.Duration, hosts []string, exportTo, gateways []string) *networkingv1.VirtualService {
		// One route each: Istio refuses (and sidecars do not get) a
		// VirtualService without routes.
		return &networkingv1.VirtualService{ObjectMeta: meta(ns, name, age), Spec: networkingapi.VirtualService{Hosts: hosts, ExportTo: exportTo, Gateways: gateways,
			Http: []*networkingapi.HTTPRoute{{Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "echo"}}}}}}}
	}
	dr := func(ns, name, host string, exportTo ...string) *networkingv1.DestinationRule {
		return &networkingv1.DestinationRule{ObjectMeta: meta(ns, name, time.Hour), Spec: networkingapi.DestinationRule{Host: host, ExportTo: exportTo}}
	}
	m := NewMesh(Inputs{
		VirtualServices: []*networkingv1.VirtualService{
			vs("b", "newer", time.Minute, []string{"echo.a.svc.cluster.local"}, nil, nil),
			vs("a", "older", time.Hour, []string{"echo"}, nil, nil),
			vs("c", "wild", 2*time.Hour, []string{"*.a.svc.cluster.local"}, nil, nil),
			vs("d", "private", 3*time.Hour, []string{"echo.a.svc.cluster.local"}, []string{"."}, nil),
			vs("e", "gateway-only", 3*time.Hour, []string{"echo.a.svc.cluster.local"}, nil, []string{"ingress"}),
			vs("f", "other-host", 3*time.Hour, []string{"other"}, nil, nil),
		},
		DestinationRules: []*networkingv1.DestinationRule{
			dr("x", "elsewhere", "echo.a.svc.cluster.local"),
			dr("a", "service-ns", "echo"),
			dr("client", "own", "echo.a.svc.cluster.local"),
			dr("y", "hidden", "echo.a.svc.cluster.local", "."),
		},
	})
	const host = "echo.a.svc.cluster.local"
	for _, tt := range []struct {
		client string
		wantVS []string
		wantDR string
	}{
		{"client", []string{"c/wild", "a/older", "b/newer"}, "client/own"},
		{"d", []string{"d/private", "c/wild", "a/older", "b/newer"}, "a/service-ns"},
		{"a", []string{"c/wild", "a/older", "b/newer"}, "a/service-ns"},
	} {
		p := Proxy{Namespace: tt.client}
		if diff := cmp.Diff(tt.wantVS, names(m.VirtualServices(p, host))); diff != "" {
			t.Errorf("VirtualServices for a client in %s (-want +got):\n%s", tt.client, diff)
		}
		got := m.DestinationRule(p, host, "a")
		if got == nil || got.Namespace+"/"+got.Name != tt.wantDR {
			t.Errorf("DestinationRule for a client in %s = %v, want %s", tt.client, got, tt.wantDR)
		}
	}
}
