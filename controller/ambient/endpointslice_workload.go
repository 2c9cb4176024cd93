package ambient

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// BuildEndpointSliceWorkloads returns a Workload for each endpoint of a
// Service's EndpointSlice that no pod stands behind (a selector-less
// Service's manual endpoints, a VM registered by hand). Endpoints of pods
// are the pods' Workloads and are skipped.
//
// Nothing is known of such an endpoint but its address: the Workload is
// named after the slice and has no workload name or type, canonical
// names, node, locality or identity. Its address may be shared with
// others, so it is marked HOST_NETWORK: a node proxy then never takes it
// for a pod of its own. An endpoint with an address that does not parse,
// or with the address of an earlier endpoint, is skipped; so are the
// slice's ports other than TCP.
func BuildEndpointSliceWorkloads(slice *discoveryv1.EndpointSlice, svc *corev1.Service, cfg Config) []*workloadapi.Workload {
	cfg = cfg.WithDefaults()
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ports := &workloadapi.PortList{}
	for _, sp := range slice.Ports {
		if sp.Name == nil || sp.Port == nil || sp.Protocol != nil && *sp.Protocol != corev1.ProtocolTCP {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Name == *sp.Name {
				ports.Ports = append(ports.Ports, &workloadapi.Port{ServicePort: uint32(p.Port), TargetPort: uint32(*sp.Port)})
				break
			}
		}
	}
	key := workloadapi.ServiceKey(svc.Namespace, ServiceHostname(svc.Name, svc.Namespace, cfg))
	var out []*workloadapi.Workload
	seen := map[string]bool{}
	for _, ep := range slice.Endpoints {
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" || len(ep.Addresses) == 0 || seen[ep.Addresses[0]] {
			continue
		}
		seen[ep.Addresses[0]] = true
		addrs, ok := endpointAddresses(ep.Addresses)
		if !ok {
			continue
		}
		w := &workloadapi.Workload{
			Uid:         workloadapi.EndpointSliceUID(cfg.ClusterID, slice.Namespace, slice.Name, ep.Addresses[0]),
			Name:        slice.Name,
			Namespace:   slice.Namespace,
			Addresses:   addrs,
			Network:     cfg.Network,
			NetworkMode: workloadapi.NetworkMode_HOST_NETWORK,
			ClusterId:   cfg.ClusterID,
			Services:    map[string]*workloadapi.PortList{key: ports},
		}
		// A nil ready condition means ready (EndpointConditions contract).
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			w.Status = workloadapi.WorkloadStatus_UNHEALTHY
		}
		if cfg.TrustDomain != workloadapi.DefaultTrustDomain {
			w.TrustDomain = cfg.TrustDomain
		}
		out = append(out, w)
	}
	return out
}

// endpointAddresses parses an endpoint's addresses; ok is false when any
// of them is not an IP address.
func endpointAddresses(in []string) (out [][]byte, ok bool) {
	for _, a := range in {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, false
		}
		out = append(out, ip.Unmap().AsSlice())
	}
	return out, true
}
