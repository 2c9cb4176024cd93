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
}

// BuildServiceEntry returns a Service per host of a ServiceEntry (none when
// it is exported to no namespace), and a Workload per inline endpoint,
// backing every host.
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
		ports = append(ports, &workloadapi.Port{
			ServicePort: p.GetNumber(),
			TargetPort:  p.GetTargetPort(),
			AppProtocol: serviceEntryAppProtocol(p.GetProtocol()),
		})
	}
	var services []*workloadapi.Service
	for _, host := range spec.GetHosts() {
		if !export.Published {
			break
		}
		services = append(services, &workloadapi.Service{
			Name:            se.Name,
			Namespace:       se.Namespace,
			Hostname:        host,
			Addresses:       vips,
			Ports:           ports,
			SubjectAltNames: spec.GetSubjectAltNames(),
			Visibility:      export.Visibility,
		})
		if !isWaypoint(se.Labels) {
			services[len(services)-1].Waypoint = in.Waypoint
		}
	}

	var workloads []*workloadapi.Workload
	for _, ep := range spec.GetEndpoints() {
		labels := ep.GetLabels()
		if len(labels) == 0 {
			labels = se.Labels
		}
		w := entryWorkload(ep, se.Namespace, labels, se.Name, cfg)
		w.Uid = workloadapi.ServiceEntryUID(cfg.ClusterID, se.Namespace, se.Name, ep.GetAddress())
		w.Name = se.Name
		w.Services = map[string]*workloadapi.PortList{}
		for _, host := range spec.GetHosts() {
			w.Services[workloadapi.ServiceKey(se.Namespace, host)] = entryPorts(spec.GetPorts(), ep.GetPorts())
		}
		workloads = append(workloads, w)
	}
	return services, workloads
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
