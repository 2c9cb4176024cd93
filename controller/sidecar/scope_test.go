package sidecar

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func sidecarResource(ns, name string, age time.Duration, selector map[string]string, hosts ...string) *networkingv1.Sidecar {
	sc := &networkingv1.Sidecar{ObjectMeta: meta(ns, name, age)}
	if selector != nil {
		sc.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: selector}
	}
	if hosts != nil {
		sc.Spec.Egress = []*networkingapi.IstioEgressListener{{Hosts: hosts}}
	}
	return sc
}

// TestSidecarScope: which services a proxy's clusters cover, by the
// Sidecar resources of its namespace and of the root namespace.
func TestSidecarScope(t *testing.T) {
	addresses := []*workloadapi.Address{
		svc("default", "reviews", "10.96.0.10", 9080),
		svc("default", "ratings", "10.96.0.11", 9080),
		svc("shop", "cart", "10.96.1.10", 80),
		entryService("shop", "ext", "api.example.com", 443),
	}
	proxy := Proxy{Namespace: "default", Labels: map[string]string{"app": "productpage"}}
	for _, tt := range []struct {
		name     string
		sidecars []*networkingv1.Sidecar
		want     []string
	}{
		{name: "no Sidecar: everything", want: []string{"api.example.com", "cart.shop.svc.cluster.local", "ratings.default.svc.cluster.local", "reviews.default.svc.cluster.local"}},
		{name: "own namespace only", sidecars: []*networkingv1.Sidecar{sidecarResource("default", "default", time.Hour, nil, "./*")},
			want: []string{"ratings.default.svc.cluster.local", "reviews.default.svc.cluster.local"}},
		{name: "a namespace and a host pattern", sidecars: []*networkingv1.Sidecar{sidecarResource("default", "default", time.Hour, nil, "shop/*", "*/*.example.com")},
			want: []string{"api.example.com", "cart.shop.svc.cluster.local"}},
		{name: "one exact host", sidecars: []*networkingv1.Sidecar{sidecarResource("default", "default", time.Hour, nil, "default/ratings.default.svc.cluster.local")},
			want: []string{"ratings.default.svc.cluster.local"}},
		{name: "~ imports nothing", sidecars: []*networkingv1.Sidecar{sidecarResource("default", "default", time.Hour, nil, "~/*")}},
		{name: "the root namespace's default", sidecars: []*networkingv1.Sidecar{sidecarResource("istio-system", "default", time.Hour, nil, "./*")}},
		{name: "own namespace's over the root's", sidecars: []*networkingv1.Sidecar{
			sidecarResource("istio-system", "default", 2*time.Hour, nil, "~/*"),
			sidecarResource("default", "default", time.Hour, nil, "shop/*"),
		}, want: []string{"api.example.com", "cart.shop.svc.cluster.local"}},
		{name: "a selecting one over the namespace's", sidecars: []*networkingv1.Sidecar{
			sidecarResource("default", "all", 2*time.Hour, nil, "*/*"),
			sidecarResource("default", "productpage", time.Hour, map[string]string{"app": "productpage"}, "./reviews.default.svc.cluster.local"),
			sidecarResource("default", "other", 3*time.Hour, map[string]string{"app": "other"}, "~/*"),
		}, want: []string{"reviews.default.svc.cluster.local"}},
		{name: "no egress: everything", sidecars: []*networkingv1.Sidecar{sidecarResource("default", "default", time.Hour, nil)},
			want: []string{"api.example.com", "cart.shop.svc.cluster.local", "ratings.default.svc.cluster.local", "reviews.default.svc.cluster.local"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMesh(Inputs{Addresses: addresses, Sidecars: tt.sidecars})
			var got []string
			for _, s := range m.visibleServices(proxy) {
				got = append(got, s.GetHostname())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("visible services (-want +got):\n%s", diff)
			}
		})
	}
}
