package sidecar

import (
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestTCPRoutes: a VirtualService's tcp routes split a TCP port's
// connections (by destination subnet, source labels and weight) before
// the service's own cluster; tls routes take a TLS port by server name.
func TestTCPRoutes(t *testing.T) {
	db := withProtocol(svc("shop", "db", "10.96.0.5", 5432), workloadapi.AppProtocol_TCP)
	vault := withProtocol(svc("shop", "vault", "10.96.0.6", 8443), workloadapi.AppProtocol_TLS)
	to := func(host, subset string, weight int32) *networkingapi.RouteDestination {
		return &networkingapi.RouteDestination{Destination: &networkingapi.Destination{Host: host, Subset: subset}, Weight: weight}
	}
	vs := func(name string, spec *networkingapi.VirtualService) *networkingv1.VirtualService {
		v := &networkingv1.VirtualService{ObjectMeta: meta("shop", name, time.Hour)}
		v.Spec.Hosts, v.Spec.Tcp, v.Spec.Tls = spec.Hosts, spec.Tcp, spec.Tls
		return v
	}
	in := Inputs{
		Addresses: []*workloadapi.Address{db, vault},
		VirtualServices: []*networkingv1.VirtualService{
			vs("db", &networkingapi.VirtualService{Hosts: []string{"db"}, Tcp: []*networkingapi.TCPRoute{
				{Match: []*networkingapi.L4MatchAttributes{{DestinationSubnets: []string{"10.99.0.0/16"}}}, Route: []*networkingapi.RouteDestination{to("db", "replica", 0)}},
				{Match: []*networkingapi.L4MatchAttributes{{SourceLabels: map[string]string{"app": "other"}}}, Route: []*networkingapi.RouteDestination{to("db", "other", 0)}},
				{Route: []*networkingapi.RouteDestination{to("db", "primary", 90), to("db", "replica", 10), to("db", "none", 0)}},
			}}),
			vs("vault", &networkingapi.VirtualService{Hosts: []string{"vault.shop.svc.cluster.local", "a.example.com"}, Tls: []*networkingapi.TLSRoute{
				{Match: []*networkingapi.TLSMatchAttributes{{SniHosts: []string{"a.example.com"}}}, Route: []*networkingapi.RouteDestination{to("db", "", 0)}},
				{Match: []*networkingapi.TLSMatchAttributes{{SniHosts: []string{"a.example.com"}, Port: 1}}, Route: []*networkingapi.RouteDestination{to("vault", "", 0)}},
			}}),
		},
	}
	m := NewMesh(in)
	p := Proxy{Namespace: "shop", Labels: map[string]string{"app": "client"}}
	type chain struct {
		Prefixes, ServerNames []string
		Cluster               string
		Weighted              map[string]uint32
	}
	summarize := func(cs []tcpChain) []chain {
		var out []chain
		for _, c := range cs {
			ch := chain{ServerNames: c.serverNames}
			for _, r := range c.prefixes {
				ch.Prefixes = append(ch.Prefixes, r.GetAddressPrefix())
			}
			var tp tcpproxyv3.TcpProxy
			if err := c.filters[len(c.filters)-1].GetTypedConfig().UnmarshalTo(&tp); err != nil {
				t.Fatal(err)
			}
			ch.Cluster = tp.GetCluster()
			for _, w := range tp.GetWeightedClusters().GetClusters() {
				if ch.Weighted == nil {
					ch.Weighted = map[string]uint32{}
				}
				ch.Weighted[w.GetName()] = w.GetWeight()
			}
			out = append(out, ch)
		}
		return out
	}
	got := summarize(m.tcpChains(p, m.Service(p, "db.shop.svc.cluster.local"), 5432, "TCP", nil, true))
	want := []chain{
		{Prefixes: []string{"10.99.0.0"}, Cluster: "outbound|5432|replica|db.shop.svc.cluster.local"},
		{Weighted: map[string]uint32{"outbound|5432|primary|db.shop.svc.cluster.local": 90, "outbound|5432|replica|db.shop.svc.cluster.local": 10}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("db's chains (-want +got):\n%s", diff)
	}
	got = summarize(m.tcpChains(p, m.Service(p, "vault.shop.svc.cluster.local"), 8443, "TLS", nil, true))
	want = []chain{{ServerNames: []string{"a.example.com"}, Cluster: "outbound|5432||db.shop.svc.cluster.local"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("vault's chains (-want +got):\n%s", diff)
	}

	// On the listener the catch-all chain is the default: nothing passes
	// through around the routes.
	var l *listenerv3.Listener
	for _, n := range m.sidecarOutboundListeners(p) {
		if n.Name == "10.96.0.5_5432" {
			l = n.Resource.(*listenerv3.Listener)
		}
	}
	if l == nil || len(l.GetFilterChains()) != 1 || l.GetDefaultFilterChain().GetName() == passthroughChainName || l.GetDefaultFilterChain().GetMetadata() == nil {
		t.Errorf("db's listener: %v", l)
	}
}
