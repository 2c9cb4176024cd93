package ambient

import (
	"net/netip"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// ServiceEntryInput is everything a ServiceEntry's entries depend on.
type ServiceEntryInput struct {
	ServiceEntry *networkingv1.ServiceEntry
	// Waypoint is the ServiceEntry's resolved waypoint, or nil.
	Waypoint *workloadapi.GatewayAddress
	// NamespaceLabels and NamespaceAnnotations are those of the
	// ServiceEntry's namespace, for istio.io/ingress-use-waypoint and
	// networking.istio.io/traffic-distribution.
	NamespaceLabels, NamespaceAnnotations Labels
	// Policies are the keys of the selector-bound authorization policies
	// that select the ServiceEntry's labels, every one in scope when it has
	// none. Its endpoints list them: istiod
	// selects an inline endpoint by its ServiceEntry's labels, not its own
	// (serviceEntryWorkloadBuilder in pilot/pkg/serviceregistry/ambient).
	Policies []string
	// MTLSPolicy is the key of the Authorization that enforces the
	// PeerAuthentication mode of those labels, or empty.
	MTLSPolicy string
}

// BuildServiceEntry returns a Service per host of a ServiceEntry (none when
// it is exported to no namespace), and a Workload per inline endpoint,
// backing every host. A ServiceEntry resolved by DNS that lists no
// endpoints and selects no workloads has one Workload per host instead,
// addressed by the host name, as istiod builds it.
func BuildServiceEntry(in ServiceEntryInput, cfg Config) ([]*workloadapi.Service, []*workloadapi.Workload) {
	cfg = cfg.WithDefaults()
	se := in.ServiceEntry
	spec := &se.Spec
	export := ServiceEntryExport(se, cfg)
	var vips []*workloadapi.NetworkAddress
	for _, a := range spec.GetAddresses() {
		if na := vip(a, cfg.Network); na != nil {
			vips = append(vips, na)
		}
	}
	var ports []*workloadapi.Port
	for _, p := range spec.GetPorts() {
		target := p.GetTargetPort()
		if target == 0 {
			target = p.GetNumber()
		}
		ports = append(ports, &workloadapi.Port{
			ServicePort: p.GetNumber(),
			TargetPort:  target,
			AppProtocol: serviceEntryAppProtocol(p.GetProtocol()),
		})
	}
	// Without addresses of its own, a host has those allocated in status.
	allocated := allocatedVIPs(se, cfg.Network)
	// Resolution NONE sends traffic on to the address it was sent to,
	// whatever its health.
	lb := &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH, HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}
	if spec.GetResolution() != networkingapi.ServiceEntry_NONE {
		lb = distribution(nil, se.Annotations, in.NamespaceAnnotations)
	}
	var services []*workloadapi.Service
	for _, host := range spec.GetHosts() {
		if !export.Published {
			break
		}
		hostVIPs := vips
		if len(vips) == 0 {
			hostVIPs = allocated[host]
		}
		services = append(services, &workloadapi.Service{
			Name:            se.Name,
			Namespace:       se.Namespace,
			Hostname:        host,
			Addresses:       hostVIPs,
			Ports:           ports,
			SubjectAltNames: spec.GetSubjectAltNames(),
			LoadBalancing:   lb,
			Visibility:      export.Visibility,
		})
		if !isWaypoint(se.Labels) {
			svc := services[len(services)-1]
			svc.Waypoint = in.Waypoint
			svc.IngressUseWaypoint = ingressUseWaypoint(in.Waypoint, se.Labels, in.NamespaceLabels)
		}
	}

	endpoints := spec.GetEndpoints()
	implicit := len(endpoints) == 0 && export.Published && resolvedByDNS(spec.GetResolution()) && spec.GetWorkloadSelector() == nil
	if implicit {
		for _, host := range spec.GetHosts() {
			endpoints = append(endpoints, &networkingapi.WorkloadEntry{Address: host})
		}
	}
	var workloads []*workloadapi.Workload
	for _, ep := range endpoints {
		w := entryWorkload(ep, se.Namespace, se.Labels, se.Name, cfg)
		w.Uid = workloadapi.ServiceEntryUID(cfg.ClusterID, se.Namespace, se.Name, ep.GetAddress())
		w.Name = se.Name
		w.AuthorizationPolicies = workloadPolicies(in.Policies, in.MTLSPolicy)
		w.Services = map[string]*workloadapi.PortList{}
		for _, host := range spec.GetHosts() {
			// An implicit endpoint backs only its own host.
			if !implicit || host == ep.GetAddress() {
				w.Services[workloadapi.ServiceKey(se.Namespace, host)] = entryPorts(spec.GetPorts(), ep.GetPorts())
			}
		}
		workloads = append(workloads, w)
	}
	return services, workloads
}

// resolvedByDNS reports the resolutions whose endpoints, when a
// ServiceEntry lists none, are its hosts themselves.
func resolvedByDNS(r networkingapi.ServiceEntry_Resolution) bool {
	switch r {
	case networkingapi.ServiceEntry_DNS, networkingapi.ServiceEntry_DNS_ROUND_ROBIN, networkingapi.ServiceEntry_DYNAMIC_DNS:
		return true
	}
	return false
}

// entryPorts maps a ServiceEntry's ports onto one endpoint: the endpoint's
// port of the same name, else the port's target port, else the service
// port itself.
func entryPorts(ports []*networkingapi.ServicePort, endpointPorts map[string]uint32) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for _, p := range ports {
		target, ok := endpointPorts[p.GetName()]
		if !ok {
			target = p.GetTargetPort()
		}
		if target == 0 {
			target = p.GetNumber()
		}
		pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: p.GetNumber(), TargetPort: target})
	}
	return pl
}

// vip parses a ServiceEntry address: an IP, or a CIDR (sent with its
// prefix length). Anything else (the API server validates) is skipped.
func vip(s, network string) *workloadapi.NetworkAddress {
	if p, err := netip.ParsePrefix(s); err == nil {
		bits := uint32(p.Bits())
		return &workloadapi.NetworkAddress{Network: network, Address: p.Addr().Unmap().AsSlice(), Length: &bits}
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return &workloadapi.NetworkAddress{Network: network, Address: a.Unmap().AsSlice()}
	}
	return nil
}
