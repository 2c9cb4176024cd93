package ambient

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// ServiceHostname is a Kubernetes Service's FQDN,
// "<name>.<namespace>.svc.<domain suffix>".
func ServiceHostname(name, namespace string, cfg Config) string {
	cfg = cfg.WithDefaults()
	return name + "." + namespace + ".svc." + cfg.DomainSuffix
}

// ServiceInput is everything a Service's table entry depends on.
type ServiceInput struct {
	Service *corev1.Service
	// NamespaceLabels are the labels of the Service's namespace, for
	// istio.io/ingress-use-waypoint.
	NamespaceLabels map[string]string
	// Waypoint is the Service's resolved waypoint, or nil.
	Waypoint *workloadapi.GatewayAddress
}

// BuildService returns the table entry of a Kubernetes Service, or nil for an
// ExternalName Service or one exported to no namespace, which are not sent
// (wire contract §7.2).
func BuildService(in ServiceInput, cfg Config) *workloadapi.Service {
	cfg = cfg.WithDefaults()
	svc := in.Service
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	export := ServiceExport(svc, cfg)
	if !export.Published {
		return nil
	}
	out := &workloadapi.Service{
		Name:          svc.Name,
		Namespace:     svc.Namespace,
		Hostname:      ServiceHostname(svc.Name, svc.Namespace, cfg),
		Addresses:     serviceAddresses(svc, cfg.Network),
		LoadBalancing: loadBalancing(svc),
		IpFamilies:    ipFamilies(svc.Spec.IPFamilies),
		Canonical:     true,
		Visibility:    export.Visibility,
	}
	if !isWaypoint(svc.Labels) {
		out.Waypoint = in.Waypoint
	}
	for _, p := range svc.Spec.Ports {
		out.Ports = append(out.Ports, &workloadapi.Port{
			ServicePort: uint32(p.Port),
			// A named target port is 0 here: each workload's entry in
			// Workload.services carries its own number.
			TargetPort:  uint32(p.TargetPort.IntVal),
			AppProtocol: servicePortAppProtocol(p),
		})
	}
	ingress := svc.Labels[LabelIngressUseWaypoint]
	if ingress == "" {
		ingress = in.NamespaceLabels[LabelIngressUseWaypoint]
	}
	out.IngressUseWaypoint = ingress == "true"
	return out
}

// serviceAddresses are the ClusterIPs as VIPs on the network, without
// "None" (headless) and empty values.
func serviceAddresses(svc *corev1.Service, network string) []*workloadapi.NetworkAddress {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []*workloadapi.NetworkAddress
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil { // "None", or garbage the API server would refuse
			continue
		}
		out = append(out, &workloadapi.NetworkAddress{Network: network, Address: a.Unmap().AsSlice()})
	}
	return out
}

// loadBalancing maps traffic policies to routing preferences
// (wire contract §7.2).
func loadBalancing(svc *corev1.Service) *workloadapi.LoadBalancing {
	var lb *workloadapi.LoadBalancing
	switch {
	case svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal:
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE},
			Mode:              workloadapi.LoadBalancing_STRICT,
		}
	case svc.Spec.TrafficDistribution != nil && preferSameZone(*svc.Spec.TrafficDistribution):
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	case svc.Spec.TrafficDistribution != nil && *svc.Spec.TrafficDistribution == corev1.ServiceTrafficDistributionPreferSameNode:
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
				workloadapi.LoadBalancing_SUBZONE, workloadapi.LoadBalancing_NODE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	}
	if svc.Spec.PublishNotReadyAddresses {
		if lb == nil {
			lb = &workloadapi.LoadBalancing{}
		}
		lb.HealthPolicy = workloadapi.LoadBalancing_ALLOW_ALL
	}
	return lb
}

// preferSameZone accepts PreferSameZone and its older spelling PreferClose.
func preferSameZone(td string) bool {
	return td == corev1.ServiceTrafficDistributionPreferSameZone || td == corev1.ServiceTrafficDistributionPreferClose
}

func ipFamilies(f []corev1.IPFamily) workloadapi.IPFamilies {
	switch {
	case len(f) >= 2:
		return workloadapi.IPFamilies_DUAL
	case len(f) == 1 && f[0] == corev1.IPv4Protocol:
		return workloadapi.IPFamilies_IPV4_ONLY
	case len(f) == 1 && f[0] == corev1.IPv6Protocol:
		return workloadapi.IPFamilies_IPV6_ONLY
	default:
		return workloadapi.IPFamilies_AUTOMATIC
	}
}
