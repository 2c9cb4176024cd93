package sidecar

import (
	"cmp"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// tlsModeLabel marks a workload that takes Istio mutual TLS.
const tlsModeLabel = "security.istio.io/tlsMode"

// Endpoints answers cluster names with their endpoint assignments (sidecar
// wire contract §3): the workloads serving the service's port (and
// carrying the subset's labels), at their target ports, HEALTHY or
// UNHEALTHY but never terminating, grouped by locality with the
// locality's weight the sum of its endpoints', and the localities
// prioritised or weighed relative to the proxy's as the service's
// DestinationRule or traffic distribution asks (locality.go). A name that
// is a valid cluster name but matches no service gets an empty
// assignment, so a client stops waiting for it.
func (m *Mesh) Endpoints(p Proxy, names []string) []Named {
	var out []Named
	for _, name := range slices.Sorted(slices.Values(names)) {
		k, err := ParseClusterName(name)
		if err != nil || k.Direction != Outbound {
			continue
		}
		out = append(out, Named{name, m.assignment(p, name, k)})
	}
	return out
}

// clusterTarget is what a proxy's outbound cluster name refers to: the
// service, its DestinationRule and the policy of the port and subset.
type clusterTarget struct {
	svc    *Service
	dr     *networkingv1.DestinationRule
	policy *networkingapi.TrafficPolicy
}

// clusterTarget looks up an outbound cluster name; false when the
// proxy sees no such cluster (no service of that hostname has the port,
// or the subset is not in its DestinationRule). Clusters, their
// endpoint assignments and shares' Absent all ask it, so that they agree.
func (m *Mesh) clusterTarget(p Proxy, name string) (clusterTarget, bool) {
	k, err := ParseClusterName(name)
	if err != nil || k.Direction != Outbound {
		return clusterTarget{}, false
	}
	svc := m.Service(p, k.Hostname)
	if svc == nil || !hasPort(svc.Service, k.Port) {
		return clusterTarget{}, false
	}
	dr := m.DestinationRule(p, k.Hostname, svc.GetNamespace())
	if m.refused(dr) {
		return clusterTarget{}, false
	}
	policy, ok := clusterPolicy(dr, k.Port, k.Subset)
	if !ok {
		return clusterTarget{}, false
	}
	return clusterTarget{svc: svc, dr: dr, policy: policy}, true
}

func (m *Mesh) assignment(p Proxy, name string, k ClusterKey) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	c, ok := m.clusterTarget(p, name)
	if !ok {
		return cla
	}
	svc, dr, policy := c.svc, c.dr, c.policy
	var sel map[string]string
	if k.Subset != "" {
		sel = subset(dr, k.Subset).GetLabels()
	}
	// Unhealthy endpoints are sent (a client counts them towards the
	// cluster's health), unless outlier detection with a minimum health
	// percentage would then route to them below its panic threshold; a
	// traffic distribution needs them to know when to spill over (its
	// panic threshold stays 0).
	withUnhealthy := locationAware(svc) || policy.GetOutlierDetection().GetMinHealthPercent() <= 0
	byLocality := map[string]*localityGroup{}
	for _, ep := range m.endpointsOf(svc) {
		target, ok := ep.Ports[k.Port]
		if !ok || ep.Terminating || !selects(sel, ep.Labels) {
			continue
		}
		healthy := ep.GetStatus() == workloadapi.WorkloadStatus_HEALTHY
		if !healthy && (!withUnhealthy || isPod(ep) && !m.isKubernetesService(svc.Service)) {
			// A ServiceEntry selects only ready pods.
			continue
		}
		lbe := m.lbEndpoint(ep, target, p.HBONE)
		if lbe == nil {
			continue
		}
		loc := ep.GetLocality()
		key := loc.GetRegion() + "/" + loc.GetZone() + "/" + loc.GetSubzone()
		g := byLocality[key]
		if g == nil {
			// Always a locality, if empty: a gRPC client rejects a group
			// without one.
			g = &localityGroup{lb: &endpointv3.LocalityLbEndpoints{
				Locality:            &corev3.Locality{Region: loc.GetRegion(), Zone: loc.GetZone(), SubZone: loc.GetSubzone()},
				LoadBalancingWeight: wrapperspb.UInt32(0),
			}}
			byLocality[key] = g
		}
		group := g.lb
		g.endpoints = append(g.endpoints, ep)
		switch {
		case !healthy:
			lbe.HealthStatus = corev3.HealthStatus_UNHEALTHY
		case ep.Entry != nil || isWorkloadEntry(ep):
			// No health is known of a ServiceEntry's own endpoints, nor
			// of a WorkloadEntry without health checks.
			lbe.HealthStatus = corev3.HealthStatus_UNKNOWN
		}
		group.LbEndpoints = append(group.LbEndpoints, lbe)
		// A client skips a locality without a weight: always set one.
		group.LoadBalancingWeight = wrapperspb.UInt32(group.LoadBalancingWeight.GetValue() + lbe.GetLoadBalancingWeight().GetValue())
	}
	var groups []localityGroup
	for _, key := range slices.Sorted(maps.Keys(byLocality)) {
		groups = append(groups, *byLocality[key])
	}
	setting, ok := effectiveLocality(policy.GetLoadBalancer(), svc)
	outlier := policy.GetOutlierDetection() != nil
	if !ok || !setting.needsPlace(outlier) {
		for _, g := range groups {
			cla.Endpoints = append(cla.Endpoints, g.lb)
		}
		return cla
	}
	cla.Endpoints = applyLocality(groups, m.placeOf(p), setting, outlier)
	return cla
}

// lbEndpoint is one workload at its target port, or nil for a workload
// without an address (a DNS name is not an EDS endpoint).
//
// With hbone, a workload of the ambient mesh (it takes HBONE) that is not
// labelled for Istio mutual TLS is reached through the proxy's
// connect_originate listener: an internal address whose original
// destination is the workload, which that listener tunnels to over HBONE.
func (m *Mesh) lbEndpoint(ep Endpoint, port uint32, hbone bool) *endpointv3.LbEndpoint {
	var addrs []netip.Addr
	for _, b := range ep.GetAddresses() {
		if a, ok := netip.AddrFromSlice(b); ok {
			addrs = append(addrs, a.Unmap())
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	// IPv4 first, as the primary address.
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int {
		return cmp.Compare(btoi(!a.Is4()), btoi(!b.Is4()))
	})
	e := &endpointv3.Endpoint{Address: socketAddress(addrs[0].String(), port)}
	for _, a := range addrs[1:] {
		e.AdditionalAddresses = append(e.AdditionalAddresses, &endpointv3.Endpoint_AdditionalAddress{Address: socketAddress(a.String(), port)})
	}
	weight := uint32(1)
	if c := ep.GetCapacity(); c != nil && c.GetValue() > 0 {
		weight = c.GetValue()
	}
	meta := map[string]*structpb.Struct{
		"istio": {Fields: map[string]*structpb.Value{"workload": structpb.NewStringValue(m.workloadMetadata(ep))}},
	}
	if tlsMode(ep) == "istio" && m.MTLSMode(ep.GetNamespace(), ep.Labels, port) != securityapi.PeerAuthentication_MutualTLS_DISABLE {
		meta["envoy.transport_socket_match"] = &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}}
	}
	if hbone && ep.GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE && tlsMode(ep) != "istio" {
		target := net.JoinHostPort(addrs[0].String(), u32(port))
		e = &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_EnvoyInternalAddress{EnvoyInternalAddress: &corev3.EnvoyInternalAddress{
			AddressNameSpecifier: &corev3.EnvoyInternalAddress_ServerListenerName{ServerListenerName: ConnectOriginate},
			EndpointId:           target,
		}}}}
		meta[originalDstMetadata] = &structpb.Struct{Fields: map[string]*structpb.Value{"local": structpb.NewStringValue(target)}}
		meta["envoy.transport_socket_match"] = &structpb.Struct{Fields: map[string]*structpb.Value{"tunnel": structpb.NewStringValue("http")}}
	}
	return &endpointv3.LbEndpoint{
		HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: e},
		HealthStatus:        corev3.HealthStatus_HEALTHY,
		LoadBalancingWeight: wrapperspb.UInt32(weight),
		Metadata:            &corev3.Metadata{FilterMetadata: meta},
	}
}

// tlsMode is the endpoint's security.istio.io/tlsMode label; a
// ServiceEntry's inline endpoint or a WorkloadEntry without one takes
// "istio" when it names a service account.
func tlsMode(ep Endpoint) string {
	if v, ok := ep.Labels[tlsModeLabel]; ok || (ep.Entry == nil && !isWorkloadEntry(ep)) {
		return v
	}
	if ep.GetServiceAccount() != "" {
		return "istio"
	}
	return ""
}

func isWorkloadEntry(ep Endpoint) bool {
	uid, err := workloadapi.ParseWorkloadUID(ep.GetUid())
	return err == nil && uid.Kind == workloadapi.KindWorkloadEntry
}

func isPod(ep Endpoint) bool {
	uid, err := workloadapi.ParseWorkloadUID(ep.GetUid())
	return err == nil && uid.Kind == workloadapi.KindPod
}

// isKubernetesService reports whether a service is a Kubernetes Service,
// by its hostname "<name>.<namespace>.svc.<domain>" (a ServiceEntry's host
// rarely takes that form).
func (m *Mesh) isKubernetesService(s *workloadapi.Service) bool {
	return s.GetHostname() == s.GetName()+"."+s.GetNamespace()+".svc."+m.DomainSuffix
}

// workloadMetadata is "<workload>;<namespace>;<canonical name>;<canonical
// revision, empty when latest>;<cluster>", which telemetry reads.
func (m *Mesh) workloadMetadata(ep Endpoint) string {
	name, canonical, rev := ep.GetWorkloadName(), ep.GetCanonicalName(), ep.GetCanonicalRevision()
	if e := ep.Entry; e != nil {
		name, canonical, rev = e.Workload, e.CanonicalName, e.CanonicalRevision
	}
	if rev == "latest" {
		rev = ""
	}
	ns := ep.GetNamespace()
	if uid, err := workloadapi.ParseWorkloadUID(ep.GetUid()); err == nil && uid.Kind == workloadapi.KindEndpointSlice && name == "" {
		// An address of an EndpointSlice that names no workload: nothing
		// to attribute it to, not even a namespace.
		ns = ""
	}
	return strings.Join([]string{name, ns, canonical, rev, cmp.Or(ep.GetClusterId(), m.ClusterID)}, ";")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
