package ambient

import (
	"errors"
	"fmt"
	"net/netip"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// WaypointRef names the waypoint Gateway an object binds to.
type WaypointRef struct {
	Namespace, Name string
}

// WaypointBinding finds the waypoint an object (pod, Service, ServiceEntry)
// binds to from its istio.io/use-waypoint label, else its namespace's. The
// label that applies also says the waypoint's namespace
// (istio.io/use-waypoint-namespace on the same object), by default the
// object's. The value "none" opts out, and on the object it overrides the
// namespace's waypoint. ok is false when there is no waypoint.
func WaypointBinding(namespace string, labels map[string]string, namespaceLabels Labels) (WaypointRef, bool) {
	for _, l := range []Labels{ReadLabels(labels, nil), namespaceLabels} {
		name, set := l.Lookup(LabelUseWaypoint)
		if !set || name == "" {
			continue
		}
		if name == NoWaypoint {
			return WaypointRef{}, false
		}
		ns := l.Get(LabelUseWaypointNamespace)
		if ns == "" {
			ns = namespace
		}
		return WaypointRef{Namespace: ns, Name: name}, true
	}
	return WaypointRef{}, false
}

// Traffic a waypoint serves (istio.io/waypoint-for).
const (
	WaypointForService  = "service"
	WaypointForWorkload = "workload"
	WaypointForAll      = "all"
	WaypointForNone     = "none"
)

// ErrNotAWaypoint is wrapped when a binding names a Gateway that cannot be
// that object's waypoint.
var ErrNotAWaypoint = errors.New("not a usable waypoint")

// WaypointAddress resolves a waypoint Gateway to the address node proxies
// send to, for service traffic (forWorkload false) or workload traffic. The
// Gateway must be of class istio-waypoint, serve that kind of traffic
// (istio.io/waypoint-for on the Gateway, else classLabels, default
// "service") and have an address in its status: a hostname is preferred,
// as "<gateway namespace>/<hostname>", over an IP.
func WaypointAddress(gw *gatewayv1.Gateway, classLabels map[string]string, forWorkload bool, cfg Config) (*workloadapi.GatewayAddress, error) {
	if gw.Spec.GatewayClassName != WaypointClass {
		return nil, fmt.Errorf("%w: gateway %s/%s has class %q, want %q", ErrNotAWaypoint, gw.Namespace, gw.Name, gw.Spec.GatewayClassName, WaypointClass)
	}
	serves := gw.Labels[LabelWaypointFor]
	if serves == "" {
		serves = classLabels[LabelWaypointFor]
	}
	if serves == "" {
		serves = WaypointForService
	}
	want := WaypointForService
	if forWorkload {
		want = WaypointForWorkload
	}
	if serves != want && serves != WaypointForAll {
		return nil, fmt.Errorf("%w: waypoint %s/%s is for %q traffic, not %q", ErrNotAWaypoint, gw.Namespace, gw.Name, serves, want)
	}
	var ip *netip.Addr
	for _, a := range gw.Status.Addresses {
		typ := gatewayv1.IPAddressType
		if a.Type != nil {
			typ = *a.Type
		}
		switch typ {
		case gatewayv1.HostnameAddressType:
			return &workloadapi.GatewayAddress{
				Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
					Namespace: gw.Namespace, Hostname: a.Value,
				}},
				HboneMtlsPort: HBONEPort,
			}, nil
		case gatewayv1.IPAddressType:
			if parsed, err := netip.ParseAddr(a.Value); err == nil && ip == nil {
				ip = &parsed
			}
		}
	}
	if ip == nil {
		return nil, fmt.Errorf("%w: waypoint %s/%s has no address in its status yet", ErrNotAWaypoint, gw.Namespace, gw.Name)
	}
	return &workloadapi.GatewayAddress{
		Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Network: cfg.Network, Address: ip.Unmap().AsSlice(),
		}},
		HboneMtlsPort: HBONEPort,
	}, nil
}
