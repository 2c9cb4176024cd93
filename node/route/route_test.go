package route

import (
	"errors"
	"net/netip"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
)

const svcKey = "apps/web.apps.svc.cluster.local"

type wl struct {
	name, ip, node, zone string
	proto                workloadapi.TunnelProtocol
	healthy              bool
	services             map[string]*workloadapi.PortList
	waypoint             *workloadapi.GatewayAddress
}

func (w wl) build() *workloadapi.Workload {
	st := workloadapi.WorkloadStatus_UNHEALTHY
	if w.healthy {
		st = workloadapi.WorkloadStatus_HEALTHY
	}
	return &workloadapi.Workload{Uid: "uid-" + w.name, Name: w.name, Namespace: "apps", ServiceAccount: w.name,
		Addresses: [][]byte{netip.MustParseAddr(w.ip).AsSlice()}, Node: w.node, Locality: &workloadapi.Locality{Region: "r", Zone: w.zone},
		TunnelProtocol: w.proto, Status: st, Services: w.services, Waypoint: w.waypoint}
}

func ports(svcPort, target uint32) map[string]*workloadapi.PortList {
	return map[string]*workloadapi.PortList{svcKey: {Ports: []*workloadapi.Port{{ServicePort: svcPort, TargetPort: target}}}}
}

func service(vip string, port, target uint32, lb *workloadapi.LoadBalancing, wp *workloadapi.GatewayAddress, sans ...string) *workloadapi.Service {
	return &workloadapi.Service{Name: "web", Namespace: "apps", Hostname: "web.apps.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: port, TargetPort: target}}, LoadBalancing: lb, Waypoint: wp, SubjectAltNames: sans}
}

func table(t *testing.T, svc *workloadapi.Service, ws ...*workloadapi.Workload) *workloadtable.Table {
	t.Helper()
	tbl := workloadtable.New()
	var rs []*discoveryv3.Resource
	add := func(a *workloadapi.Address) {
		b, err := proto.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &discoveryv3.Resource{Name: workloadapi.ResourceName(a), Resource: &anypb.Any{TypeUrl: workloadapi.AddressTypeURL, Value: b}})
	}
	if svc != nil {
		add(&workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}})
	}
	for _, w := range ws {
		add(&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
	}
	if rej := tbl.Apply(workloadapi.AddressTypeURL, rs, nil); rej != nil {
		t.Fatal(rej)
	}
	return tbl
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func id(sa string) workloadapi.Identity {
	return workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: sa}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	hbone := workloadapi.TunnelProtocol_HBONE
	src := wl{name: "client", ip: "10.244.1.2", node: "n1", zone: "a", proto: hbone, healthy: true}.build()
	near := wl{name: "near", ip: "10.244.1.5", node: "n1", zone: "a", proto: hbone, healthy: true, services: ports(80, 8080)}.build()
	far := wl{name: "far", ip: "10.244.2.5", node: "n2", zone: "b", proto: hbone, healthy: true, services: ports(80, 8080)}.build()
	sick := wl{name: "sick", ip: "10.244.1.6", node: "n1", zone: "a", proto: hbone, services: ports(80, 8080)}.build()
	plain := wl{name: "plain", ip: "10.244.3.5", node: "n3", proto: workloadapi.TunnelProtocol_NONE, healthy: true}.build()
	named := wl{name: "named", ip: "10.244.1.7", node: "n1", zone: "a", proto: hbone, healthy: true, services: ports(80, 9090)}.build()
	wpHost := &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "apps", Hostname: "waypoint.apps.svc.cluster.local"}}, HboneMtlsPort: 15008}
	waypoint := wl{name: "waypoint", ip: "10.244.4.5", node: "n4", proto: hbone, healthy: true,
		services: map[string]*workloadapi.PortList{"apps/waypoint.apps.svc.cluster.local": {}}}.build()
	wpAddr := &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: netip.MustParseAddr("10.244.4.5").AsSlice()}}, HboneMtlsPort: 15008}
	behindWP := wl{name: "behind", ip: "10.244.5.5", node: "n5", proto: hbone, healthy: true, waypoint: wpAddr}.build()
	private := service("10.96.0.10", 80, 8080, nil, nil)
	private.Visibility = workloadapi.Service_NAMESPACE
	outsider := wl{name: "outsider", ip: "10.244.1.3", node: "n1", zone: "a", proto: hbone, healthy: true}.build()
	outsider.Namespace = "other"

	for _, tt := range []struct {
		name    string
		svc     *workloadapi.Service
		ws      []*workloadapi.Workload
		src     *workloadapi.Workload
		dst     string
		want    Route
		wantErr error
	}{
		{name: "outside the mesh", dst: "192.0.2.1:443", want: Route{Kind: TCP, Addr: ap("192.0.2.1:443")}},
		{name: "pod over HBONE", ws: []*workloadapi.Workload{near}, dst: "10.244.1.5:8080",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "NONE workload is plain TCP", ws: []*workloadapi.Workload{plain}, dst: "10.244.3.5:5432",
			want: Route{Kind: TCP, Addr: ap("10.244.3.5:5432"), Workload: plain}},
		{name: "service VIP maps the target port", svc: service("10.96.0.10", 80, 8080, nil, nil), ws: []*workloadapi.Workload{near}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "named port from the workload", svc: service("10.96.0.10", 80, 0, nil, nil), ws: []*workloadapi.Workload{named}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.7:15008"), Authority: "10.244.1.7:9090", Workload: named, Identities: []workloadapi.Identity{id("named")}}},
		{name: "unhealthy endpoints are skipped", svc: service("10.96.0.10", 80, 8080, nil, nil), ws: []*workloadapi.Workload{sick, far}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.2.5:15008"), Authority: "10.244.2.5:8080", Workload: far, Identities: []workloadapi.Identity{id("far")}}},
		{name: "only unhealthy: no endpoint", svc: service("10.96.0.10", 80, 8080, nil, nil), ws: []*workloadapi.Workload{sick}, dst: "10.96.0.10:80", wantErr: ErrNoEndpoint},
		{name: "ALLOW_ALL takes the unhealthy", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}, nil), ws: []*workloadapi.Workload{sick}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.6:15008"), Authority: "10.244.1.6:8080", Workload: sick, Identities: []workloadapi.Identity{id("sick")}}},
		{name: "STRICT node: the local endpoint", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_STRICT, RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE}}, nil),
			ws: []*workloadapi.Workload{far, near}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "STRICT node without a local endpoint", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_STRICT, RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE}}, nil),
			ws: []*workloadapi.Workload{far}, dst: "10.96.0.10:80", wantErr: ErrNoEndpoint},
		{name: "FAILOVER falls back to another zone", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_FAILOVER, RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE}}, nil),
			ws: []*workloadapi.Workload{far}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.2.5:15008"), Authority: "10.244.2.5:8080", Workload: far, Identities: []workloadapi.Identity{id("far")}}},
		{name: "FAILOVER prefers the same zone", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_FAILOVER, RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE}}, nil),
			ws: []*workloadapi.Workload{far, near}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "PASSTHROUGH goes to the original destination", svc: service("10.96.0.10", 80, 8080, &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH}, nil), ws: []*workloadapi.Workload{near}, dst: "10.96.0.10:80",
			want: Route{Kind: TCP, Addr: ap("10.96.0.10:80")}},
		{name: "service SANs are accepted too", svc: service("10.96.0.10", 80, 8080, nil, nil, "spiffe://cluster.local/ns/apps/sa/extra", "not-an-id"), ws: []*workloadapi.Workload{near}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near"), id("extra")}}},
		{name: "service waypoint, addressed to the VIP", svc: service("10.96.0.10", 80, 8080, nil, wpHost), ws: []*workloadapi.Workload{near, waypoint}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.4.5:15008"), Authority: "10.96.0.10:80", Workload: waypoint, Identities: []workloadapi.Identity{id("waypoint")}, Waypoint: true}},
		{name: "the waypoint itself bypasses it", svc: service("10.96.0.10", 80, 8080, nil, wpHost), ws: []*workloadapi.Workload{near, waypoint}, src: waypoint, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "workload waypoint for direct traffic", ws: []*workloadapi.Workload{behindWP, waypoint}, dst: "10.244.5.5:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.4.5:15008"), Authority: "10.244.5.5:80", Workload: waypoint, Identities: []workloadapi.Identity{id("waypoint")}, Waypoint: true}},
		{name: "a namespace-visible service serves its namespace", svc: private, ws: []*workloadapi.Workload{near}, dst: "10.96.0.10:80",
			want: Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: near, Identities: []workloadapi.Identity{id("near")}}},
		{name: "a namespace-visible service is absent for other namespaces", svc: private, ws: []*workloadapi.Workload{near}, src: outsider, dst: "10.96.0.10:80",
			want: Route{Kind: TCP, Addr: ap("10.96.0.10:80")}},
		{name: "service waypoint without endpoints", svc: service("10.96.0.10", 80, 8080, nil, wpHost), ws: []*workloadapi.Workload{near}, dst: "10.96.0.10:80", wantErr: ErrNoEndpoint},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			from := tt.src
			if from == nil {
				from = src
			}
			got, err := Decide(table(t, tt.svc, tt.ws...), from, ap(tt.dst), func(int) int { return 0 })
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Decide() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.AddrPort{}), cmp.Comparer(proto.Equal)); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
