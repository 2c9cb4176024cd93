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
func BuildEndpointSliceWorkloads(slice *discoveryv1.EndpointSlice, svc *corev1.Service, cfg Config) []*workloadapi.Workload {
	cfg = cfg.WithDefaults()
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ports := &workloadapi.PortList{}
	for _, sp := range slice.Ports {
		if sp.Port == nil {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Name == ptrValue(sp.Name) && protocolOf(p.Protocol) == protocolOf(ptrValue(sp.Protocol)) {
				ports.Ports = append(ports.Ports, &workloadapi.Port{ServicePort: uint32(p.Port), TargetPort: uint32(*sp.Port)})
			}
		}
	}
	key := workloadapi.ServiceKey(svc.Namespace, ServiceHostname(svc.Name, svc.Namespace, cfg))
	var out []*workloadapi.Workload
	for _, ep := range slice.Endpoints {
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" || len(ep.Addresses) == 0 {
			continue
		}
		var addrs [][]byte
		for _, a := range ep.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				addrs = append(addrs, ip.Unmap().AsSlice())
			}
		}
		if len(addrs) == 0 {
			continue
		}
		name := slice.Name
		if ep.TargetRef != nil && ep.TargetRef.Name != "" {
			name = ep.TargetRef.Name
		}
		w := &workloadapi.Workload{
			Uid:          workloadapi.EndpointSliceUID(cfg.ClusterID, slice.Namespace, slice.Name, ep.Addresses[0]),
			Name:         name,
			Namespace:    slice.Namespace,
			Addresses:    addrs,
			Network:      cfg.Network,
			Node:         ptrValue(ep.NodeName),
			WorkloadType: workloadapi.WorkloadType_POD,
			WorkloadName: svc.Name,
			ClusterId:    cfg.ClusterID,
			Services:     map[string]*workloadapi.PortList{key: ports},
		}
		w.CanonicalName, w.CanonicalRevision = svc.Name, "latest"
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
