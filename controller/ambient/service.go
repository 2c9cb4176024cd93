package ambient

import (
	"net/netip"
	"strconv"
	"strings"

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
	NamespaceLabels Labels
	// NamespaceAnnotations are the annotations of the Service's namespace,
	// for networking.istio.io/traffic-distribution.
	NamespaceAnnotations Labels
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
		LoadBalancing: loadBalancing(svc, in.NamespaceAnnotations),
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
	out.IngressUseWaypoint = ingressUseWaypoint(out.Waypoint, svc.Labels, in.NamespaceLabels)
	return out
}

// ingressUseWaypoint reads istio.io/ingress-use-waypoint from an object's
// labels, else from its namespace's, for an object bound to a waypoint:
// without one there is nothing to send ingress traffic through. The value
// is a boolean as strconv reads it ("true", "1", "T", ...); any other
// value is false.
func ingressUseWaypoint(waypoint *workloadapi.GatewayAddress, lbls map[string]string, namespaceLabels Labels) bool {
	if waypoint == nil {
		return false
	}
	v, ok := lbls[LabelIngressUseWaypoint]
	if !ok {
		v = namespaceLabels.Get(LabelIngressUseWaypoint)
	}
	b, err := strconv.ParseBool(v)
	return err == nil && b
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
// (wire contract §7.2): internalTrafficPolicy Local first, then the
// traffic distribution (see distribution), then publishNotReadyAddresses.
func loadBalancing(svc *corev1.Service, namespaceAnnotations Labels) *workloadapi.LoadBalancing {
	var lb *workloadapi.LoadBalancing
	if svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal {
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE},
			Mode:              workloadapi.LoadBalancing_STRICT,
		}
	} else {
		lb = distribution(svc.Spec.TrafficDistribution, svc.Annotations, namespaceAnnotations)
	}
	if svc.Spec.PublishNotReadyAddresses {
		if lb == nil {
			lb = &workloadapi.LoadBalancing{}
		}
		lb.HealthPolicy = workloadapi.LoadBalancing_ALLOW_ALL
	}
	return lb
}

// distribution is the load balancing a traffic distribution asks for, or
// nil for any endpoint. A known spec value wins; otherwise the
// networking.istio.io/traffic-distribution annotation of the object, else
// of its namespace, decides (its value compared without case; an unknown
// value means any endpoint, and the namespace's is not read then).
func distribution(spec *string, annotations map[string]string, namespaceAnnotations Labels) *workloadapi.LoadBalancing {
	value := ""
	if spec != nil && knownDistribution(*spec) {
		value = *spec
	} else if v := annotations[AnnotationTrafficDistribution]; v != "" {
		value = v
	} else {
		value = namespaceAnnotations.Get(AnnotationTrafficDistribution)
	}
	switch {
	case strings.EqualFold(value, corev1.ServiceTrafficDistributionPreferSameZone),
		strings.EqualFold(value, corev1.ServiceTrafficDistributionPreferClose):
		return &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	case strings.EqualFold(value, corev1.ServiceTrafficDistributionPreferSameNode):
		return &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
				workloadapi.LoadBalancing_SUBZONE, workloadapi.LoadBalancing_NODE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	}
	return nil
}

// knownDistribution reports the spec.trafficDistribution values Canopy
// acts on: PreferSameZone, its older spelling PreferClose, PreferSameNode.
func knownDistribution(td string) bool {
	switch td {
	case corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferClose,
		corev1.ServiceTrafficDistributionPreferSameNode:
		return true
	}
	return false
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
