// Package sidecartest builds sidecar.Inputs of a given size for
// benchmarks and tests.
package sidecartest

import (
	"fmt"
	"net/netip"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Mesh is a mesh of n Services ("svc-<i>" in namespace "ns-<i%10>", port
// 8080 to target port 9080, protocol gRPC) of perService endpoints each
// (pods "svc-<i>-<j>" labelled app and version v0/v1, over three zones),
// with a VirtualService splitting 90/10 between the versions and a
// DestinationRule with both subsets for every tenth Service.
func Mesh(n, perService int) sidecar.Inputs {
	in := sidecar.Inputs{}
	labels := map[string]map[string]string{}
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i%10)
		name := fmt.Sprintf("svc-%d", i)
		host := name + "." + ns + ".svc.cluster.local"
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		in.Addresses = append(in.Addresses, &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: name, Namespace: ns, Hostname: host,
			Addresses: []*workloadapi.NetworkAddress{{Address: vip.AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 8080, TargetPort: 9080, AppProtocol: workloadapi.AppProtocol_GRPC}},
		}}})
		for j := range perService {
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
