package sidecar

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMergeDelegates: a root's delegating route becomes the delegate's
// routes, narrowed by its match and filled in by its fields; a delegate
// route outside the root's match (a path, more gateways than the root
// names), and a delegate not exported to the root, route nothing.
func TestMergeDelegates(t *testing.T) {
	prefix := func(p string) *networkingapi.StringMatch {
		return &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Prefix{Prefix: p}}
	}
	exact := func(p string) *networkingapi.StringMatch {
		return &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Exact{Exact: p}}
	}
	to := func(host string) []*networkingapi.HTTPRouteDestination {
		return []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: host}}}
	}
	vs := func(ns, name string, hosts []string, exportTo []string, http ...*networkingapi.HTTPRoute) *networkingv1.VirtualService {
		return &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingapi.VirtualService{Hosts: hosts, ExportTo: exportTo, Http: http}}
	}
	root := vs("front", "root", []string{"front"}, nil,
		&networkingapi.HTTPRoute{
			Name:     "api",
			Match:    []*networkingapi.HTTPMatchRequest{{Name: "m", Uri: prefix("/api/"), Gateways: []string{"mesh"}}},
			Delegate: &networkingapi.Delegate{Name: "api", Namespace: "team"},
			Timeout:  durationpb.New(3e9),
		},
		&networkingapi.HTTPRoute{Name: "hidden", Delegate: &networkingapi.Delegate{Name: "private", Namespace: "team"}},
		&networkingapi.HTTPRoute{Name: "rest", Route: to("front")},
	)
	api := vs("team", "api", nil, nil,
		&networkingapi.HTTPRoute{Name: "orders", Match: []*networkingapi.HTTPMatchRequest{{Name: "o", Uri: exact("/api/orders")}}, Route: to("orders")},
		&networkingapi.HTTPRoute{Name: "outside", Match: []*networkingapi.HTTPMatchRequest{{Uri: prefix("/other/")}}, Route: to("orders")},
		&networkingapi.HTTPRoute{Name: "more-gateways", Match: []*networkingapi.HTTPMatchRequest{{Gateways: []string{"mesh", "mesh"}}}, Route: to("orders")},
		&networkingapi.HTTPRoute{Route: to("catalog.shop.svc.cluster.local"), Timeout: durationpb.New(1e9)},
	)
	private := vs("team", "private", nil, []string{"."}, &networkingapi.HTTPRoute{Route: to("secret")})

	got := mergeDelegates([]*networkingv1.VirtualService{root, api, private}, "cluster.local")
	want := []*networkingapi.HTTPRoute{
		{
			Name:    "api-orders",
			Match:   []*networkingapi.HTTPMatchRequest{{Name: "m-o", Uri: exact("/api/orders"), Gateways: []string{"mesh"}}},
			Route:   to("orders.team.svc.cluster.local"),
			Timeout: durationpb.New(3e9),
		},
		{
			Name:    "api",
			Match:   []*networkingapi.HTTPMatchRequest{{Name: "m", Uri: prefix("/api/"), Gateways: []string{"mesh"}}},
			Route:   to("catalog.shop.svc.cluster.local"),
			Timeout: durationpb.New(1e9),
		},
		{Name: "rest", Route: to("front")},
	}
	if diff := cmp.Diff(want, got[0].Spec.GetHttp(), protocmp.Transform()); diff != "" {
		t.Errorf("root's routes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(api.Spec.GetHttp()[0].GetRoute(), to("orders"), protocmp.Transform()); diff != "" {
		t.Errorf("the delegate itself changed:\n%s", diff)
	}
	if len(got) != 3 || got[1] != api || got[2] != private {
		t.Errorf("delegates are kept as they are")
	}
}
