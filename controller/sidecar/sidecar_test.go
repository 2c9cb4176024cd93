package sidecar

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/google/go-cmp/cmp"

	goldenfile "github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// sidecarProxy is reviews-v1's sidecar in testMesh.
var sidecarProxy = Proxy{Namespace: "default", Labels: map[string]string{"app": "reviews", "version": "v1", tlsModeLabel: "istio"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.1")}}

// TestSidecarResourcesGolden: everything a sidecar gets from testMesh,
// each resource valid.
func TestSidecarResourcesGolden(t *testing.T) {
	m := testMesh()
	got := map[string][]Named{
		"clusters":  m.GenerateSidecar(sidecarProxy, ClusterType, nil),
		"listeners": m.GenerateSidecar(sidecarProxy, ListenerType, []string{"ignored"}),
		"routes":    m.GenerateSidecar(sidecarProxy, RouteType, []string{"9080", "9090", "80", "reviews.default.svc.cluster.local:9080", "garbage"}),
	}
	var buf bytes.Buffer
	for _, kind := range []string{"clusters", "listeners", "routes"} {
		buf.WriteString("# " + kind + "\n")
		for _, n := range got[kind] {
			if err := n.Resource.(validator).ValidateAll(); err != nil {
				t.Errorf("%s %q: invalid: %v", kind, n.Name, err)
			}
			writeGoldenResource(t, &buf, n)
		}
	}
	goldenfile.Check(t, "sidecar.golden", buf.Bytes())
}

func namedNames(ns []Named) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out
}

// TestSidecarNames: the resources a sidecar gets are named as Istio's
// sidecars expect them.
func TestSidecarNames(t *testing.T) {
	m := testMesh()
	clusters := namedNames(m.SidecarClusters(sidecarProxy))
	for _, want := range []string{
		BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster,
		"outbound|9080||reviews.default.svc.cluster.local", "outbound|9080|v1|reviews.default.svc.cluster.local",
		"outbound|27017||mongo.default.svc.cluster.local", "inbound|10080||",
	} {
		if !slices.Contains(clusters, want) {
			t.Errorf("no cluster %q in %v", want, clusters)
		}
	}
	listeners := namedNames(m.SidecarListeners(sidecarProxy))
	for _, want := range []string{VirtualOutbound, VirtualInbound, "0.0.0.0_9080", "10.96.0.12_27017"} {
		if !slices.Contains(listeners, want) {
			t.Errorf("no listener %q in %v", want, listeners)
		}
	}
}

// TestSidecarMutualTLS: a cluster takes Istio mutual TLS towards endpoints
// labelled for it, unless a rule decides; the inbound port of a STRICT
// workload takes only mutual TLS.
func TestSidecarMutualTLS(t *testing.T) {
	m := testMesh()
	byName := map[string]*clusterv3.Cluster{}
	for _, n := range m.SidecarClusters(sidecarProxy) {
		byName[n.Name] = n.Resource.(*clusterv3.Cluster)
	}
	var matches []string
	for _, tsm := range byName["outbound|9080||ratings.default.svc.cluster.local"].GetTransportSocketMatches() {
		matches = append(matches, tsm.GetName())
	}
	if diff := cmp.Diff([]string{"tlsMode-istio", "tlsMode-disabled"}, matches); diff != "" {
		t.Errorf("auto mutual TLS matches (-want +got):\n%s", diff)
	}
	if c := byName["outbound|80||ext.example.com"]; c == nil {
		t.Error("no cluster for the ServiceEntry host")
	}
	var inbound *listenerv3.Listener
	for _, n := range m.SidecarListeners(sidecarProxy) {
		if n.Name == VirtualInbound {
			inbound = n.Resource.(*listenerv3.Listener)
		}
	}
	for _, fc := range inbound.GetFilterChains() {
		if fc.GetFilterChainMatch().GetDestinationPort().GetValue() == 10080 && fc.GetTransportSocket() == nil && m.MTLSMode("default", sidecarProxy.Labels, 10080).String() == "STRICT" {
			t.Errorf("chain %s of a STRICT port takes plaintext", fc.GetName())
		}
	}
}

// TestSidecarReachesAmbientOverHBONE: a sidecar reaches a workload of the
// ambient mesh through its connect_originate listener, and every other
// endpoint as before; a gRPC client never tunnels.
func TestSidecarReachesAmbientOverHBONE(t *testing.T) {
	ambient := pod("default", "ratings-v9", "10.244.5.9", "", map[string][]uint32{"default/ratings.default.svc.cluster.local": {9080}})
	ambient.GetWorkload().TunnelProtocol = workloadapi.TunnelProtocol_HBONE
	m := NewMesh(Inputs{Addresses: []*workloadapi.Address{
		svc("default", "ratings", "10.96.0.11", 9080),
		pod("default", "ratings-v1", "10.244.3.1", "", map[string][]uint32{"default/ratings.default.svc.cluster.local": {9080}}),
		ambient,
	}})
	const cluster = "outbound|9080||ratings.default.svc.cluster.local"
	addresses := func(p Proxy) []string {
		var out []string
		for _, n := range m.GenerateSidecar(p, EndpointType, []string{cluster}) {
			for _, g := range n.Resource.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
				for _, e := range g.GetLbEndpoints() {
					a := e.GetEndpoint().GetAddress()
					if in := a.GetEnvoyInternalAddress(); in != nil {
						out = append(out, in.GetServerListenerName()+"/"+in.GetEndpointId()+" tunnel="+e.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tunnel"].GetStringValue())
					} else {
						out = append(out, a.GetSocketAddress().GetAddress())
					}
				}
			}
		}
		return out
	}
	p := Proxy{Namespace: "default"}
	if diff := cmp.Diff([]string{"10.244.3.1", "connect_originate/10.244.5.9:10080 tunnel=http"}, addresses(p)); diff != "" {
		t.Errorf("a sidecar's endpoints (-want +got):\n%s", diff)
	}
	var grpcAddrs []string
	for _, n := range m.Endpoints(p, []string{cluster}) {
		for _, g := range n.Resource.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
			for _, e := range g.GetLbEndpoints() {
				grpcAddrs = append(grpcAddrs, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
	}
	if diff := cmp.Diff([]string{"10.244.3.1", "10.244.5.9"}, grpcAddrs); diff != "" {
		t.Errorf("a gRPC client's endpoints (-want +got):\n%s", diff)
	}
	var first string
	var haveOriginate bool
	for _, n := range m.GenerateSidecar(p, ClusterType, nil) {
		if n.Name == cluster {
			first = n.Resource.(*clusterv3.Cluster).GetTransportSocketMatches()[0].GetName()
		}
		haveOriginate = haveOriginate || n.Name == ConnectOriginate
	}
	if first != "hbone" || !haveOriginate {
		t.Errorf("first socket match %q, connect_originate cluster %v; want hbone, true", first, haveOriginate)
	}
}

// TestSidecarRouteDomainsUnique: one address given to two hosts (a
// ServiceEntry of several hosts) stays with the first: Envoy refuses a
// route configuration whose virtual hosts share a domain.
func TestSidecarRouteDomainsUnique(t *testing.T) {
	a := svc("default", "a", "10.96.0.20", 80)
	b := svc("default", "b", "10.96.0.20", 80)
	m := NewMesh(Inputs{Addresses: []*workloadapi.Address{withProtocol(a, workloadapi.AppProtocol_HTTP11), withProtocol(b, workloadapi.AppProtocol_HTTP11)}})
	seen := map[string]string{}
	for _, n := range m.SidecarRoutes(Proxy{Namespace: "default"}, []string{"80"}) {
		if err := n.Resource.(validator).ValidateAll(); err != nil {
			t.Fatal(err)
		}
		for _, vh := range n.Resource.(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, d := range vh.GetDomains() {
				if other, dup := seen[d]; dup {
					t.Errorf("domain %q in virtual hosts %s and %s", d, other, vh.GetName())
				}
				seen[d] = vh.GetName()
			}
		}
	}
	if seen["10.96.0.20"] != "a.default.svc.cluster.local:80" {
		t.Errorf("the shared address went to %q, want the first host's", seen["10.96.0.20"])
	}
}
