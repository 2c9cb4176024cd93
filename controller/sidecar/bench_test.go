package sidecar

import (
	"fmt"
	"net/netip"
	"testing"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// benchInputs is a mesh of 1,000 Services of 10 endpoints each (10,000
// workloads) in 10 namespaces, a VirtualService and a DestinationRule with
// two subsets for every tenth Service.
func benchInputs() Inputs {
	in := Inputs{}
	labels := map[string]map[string]string{}
	for i := range 1000 {
		ns := fmt.Sprintf("ns-%d", i%10)
		name := fmt.Sprintf("svc-%d", i)
		host := name + "." + ns + ".svc.cluster.local"
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		in.Addresses = append(in.Addresses, &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: name, Namespace: ns, Hostname: host,
			Addresses: []*workloadapi.NetworkAddress{{Address: vip.AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 8080, TargetPort: 9080, AppProtocol: workloadapi.AppProtocol_GRPC}},
		}}})
		for j := range 10 {
			pod := fmt.Sprintf("%s-%d", name, j)
			uid := workloadapi.PodUID("Kubernetes", ns, pod)
			ip := netip.AddrFrom4([4]byte{10, byte(100 + j), byte(i >> 8), byte(i)})
			in.Addresses = append(in.Addresses, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
				Uid: uid, Name: pod, Namespace: ns, Addresses: [][]byte{ip.AsSlice()}, ServiceAccount: name,
				Locality: &workloadapi.Locality{Region: "r", Zone: fmt.Sprintf("z%d", j%3)},
				Services: map[string]*workloadapi.PortList{ns + "/" + host: {Ports: []*workloadapi.Port{{ServicePort: 8080, TargetPort: 9080}}}},
			}}})
			labels[uid] = map[string]string{"app": name, "version": fmt.Sprintf("v%d", j%2)}
		}
		if i%10 == 0 {
			meta := metav1.ObjectMeta{Namespace: ns, Name: name}
			in.DestinationRules = append(in.DestinationRules, &networkingv1.DestinationRule{ObjectMeta: meta, Spec: networkingapi.DestinationRule{
				Host: name, Subsets: []*networkingapi.Subset{{Name: "v0", Labels: map[string]string{"version": "v0"}}, {Name: "v1", Labels: map[string]string{"version": "v1"}}},
			}})
			in.VirtualServices = append(in.VirtualServices, &networkingv1.VirtualService{ObjectMeta: meta, Spec: networkingapi.VirtualService{
				Hosts: []string{name}, Http: []*networkingapi.HTTPRoute{{Route: []*networkingapi.HTTPRouteDestination{
					{Destination: &networkingapi.Destination{Host: name, Subset: "v0"}, Weight: 90},
					{Destination: &networkingapi.Destination{Host: name, Subset: "v1"}, Weight: 10},
				}}},
			}})
		}
	}
	in.Labels = func(uid string) map[string]string { return labels[uid] }
	return in
}

// BenchmarkNewMesh: what every change of the mesh costs once, before any
// client is served.
func BenchmarkNewMesh(b *testing.B) {
	in := benchInputs()
	b.ReportAllocs()
	for b.Loop() {
		NewMesh(in)
	}
}

// BenchmarkGRPCClientPush: one proxyless client's whole push (listeners,
// routes, clusters with both subsets, endpoints) for the 10 Services it
// calls, in a mesh of 1,000.
func BenchmarkGRPCClientPush(b *testing.B) {
	m := NewMesh(benchInputs())
	p := Proxy{Namespace: "ns-0"}
	var listeners, routes, clusters []string
	for i := 0; i < 100; i += 10 {
		host := fmt.Sprintf("svc-%d.ns-0.svc.cluster.local", i)
		listeners = append(listeners, host+":8080")
		routes = append(routes, ClusterName(Outbound, 8080, "", host))
		for _, ss := range []string{"", "v0", "v1"} {
			clusters = append(clusters, ClusterName(Outbound, 8080, ss, host))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(m.GRPCListeners(p, listeners)) != 10 || len(m.GRPCRoutes(p, routes)) != 10 ||
			len(m.GRPCClusters(p, clusters)) != 30 || len(m.Endpoints(p, clusters)) != 30 {
			b.Fatal("missing resources")
		}
	}
}
