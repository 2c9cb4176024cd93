// Package route decides where an outbound connection goes
// (docs/wire-contract.md §5.5): a service's waypoint, one of its endpoints
// picked by its load-balancing rules, a workload's waypoint, straight HBONE
// to a pod, or plain TCP. Pure: the table and the connection in, a Route out.
package route

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Kind is how the connection is carried.
type Kind int

const (
	// HBONE to Addr (a pod's or waypoint's 15008) with Authority.
	HBONE Kind = iota
	// TCP: plain TCP to Addr (outside the mesh, or a NONE workload).
	TCP
)

// Route is the decision.
type Route struct {
	Kind Kind
	// Addr is where the TCP or TLS connection goes.
	Addr netip.AddrPort
	// Authority is the CONNECT target (HBONE only).
	Authority string
	// Workload is the endpoint (or the waypoint) chosen; nil for
	// passthrough.
	Workload *workloadapi.Workload
	// Identities the server must present (HBONE only).
	Identities []workloadapi.Identity
	// Waypoint reports that the route goes through a waypoint.
	Waypoint bool
}

// Table is what routing reads; *workloadtable.Table implements it.
type Table interface {
	// ByAddress finds a workload, or a service every namespace may see.
	ByAddress(network string, ip netip.Addr) (*workloadapi.Workload, *workloadapi.Service)
	// ByAddressFrom finds a workload, or a service the clients of
	// namespace ns may see (Service.visibility).
	ByAddressFrom(ns, network string, ip netip.Addr) (*workloadapi.Workload, *workloadapi.Service)
	ServiceWorkloads(key string) []*workloadapi.Workload
	Service(key string) *workloadapi.Service
}

// ErrNoEndpoint: a service with no endpoint the rules allow.
var ErrNoEndpoint = errors.New("no healthy endpoint")

const hbonePort = 15008

// Decide routes a connection from src to dst; pick chooses one of n
// candidates (random in production, fixed in tests). The destination is
// looked up as src's namespace sees it: a service src may not see is as
// good as absent, so its VIP goes out as plain TCP like any address
// outside the mesh, as ztunnel does.
// A destination that is the proxy itself fails with ErrSelfCall.
func Decide(t Table, src *workloadapi.Workload, dst netip.AddrPort, pick func(n int) int) (Route, error) {
	w, svc := t.ByAddressFrom(src.GetNamespace(), src.GetNetwork(), dst.Addr())
	r, err := decide(t, src, dst, w, svc, pick)
	if err != nil {
		return Route{}, err
	}
	if err := checkOutbound(src, dst, w != nil || svc != nil, r); err != nil {
		return Route{}, err
	}
	return r, nil
}

func decide(t Table, src *workloadapi.Workload, dst netip.AddrPort, w *workloadapi.Workload, svc *workloadapi.Service, pick func(n int) int) (Route, error) {
	if svc != nil {
		// 1. A service's waypoint gets the traffic, addressed to the VIP.
		if wp := svc.GetWaypoint(); wp != nil && !isWaypoint(src, wp, t) {
			return toWaypoint(t, src, wp, dst, pick)
		}
		lb := svc.GetLoadBalancing()
		if lb.GetMode() == workloadapi.LoadBalancing_PASSTHROUGH {
			return Route{Kind: TCP, Addr: dst}, nil
		}
		key := workloadapi.ServiceKey(svc.GetNamespace(), svc.GetHostname())
		eps := candidates(t.ServiceWorkloads(key), src, lb)
		if len(eps) == 0 {
			return Route{}, fmt.Errorf("%w for %s", ErrNoEndpoint, key)
		}
		ep := eps[pick(len(eps))]
		port := targetPort(svc, ep, key, dst.Port())
		r := direct(ep, dst.Addr(), port)
		for _, san := range svc.GetSubjectAltNames() {
			if id, err := workloadapi.ParseIdentity(san); err == nil {
				r.Identities = append(r.Identities, id)
			}
		}
		return r, nil
	}
	if w == nil {
		return Route{Kind: TCP, Addr: dst}, nil // outside the mesh
	}
	// 3. A workload's own waypoint, unless the source is that waypoint.
	if wp := w.GetWaypoint(); wp != nil && !isWaypoint(src, wp, t) {
		return toWaypoint(t, src, wp, dst, pick)
	}
	return direct(w, dst.Addr(), dst.Port()), nil
}

// direct is HBONE to the pod, or plain TCP for a NONE workload, at the
// pod's address of the family of like (a dual-stack pod is reached over
// the family the client used).
func direct(w *workloadapi.Workload, like netip.Addr, port uint16) Route {
	ip := addrLike(w, like)
	if w.GetTunnelProtocol() != workloadapi.TunnelProtocol_HBONE {
		return Route{Kind: TCP, Addr: netip.AddrPortFrom(ip, port), Workload: w}
	}
	return Route{Kind: HBONE, Addr: netip.AddrPortFrom(ip, hbonePort), Authority: netip.AddrPortFrom(ip, port).String(),
		Workload: w, Identities: []workloadapi.Identity{workloadapi.WorkloadIdentity(w)}}
}

// toWaypoint sends to the waypoint with the original destination as the
// authority.
func toWaypoint(t Table, src *workloadapi.Workload, wp *workloadapi.GatewayAddress, dst netip.AddrPort, pick func(int) int) (Route, error) {
	var wpw *workloadapi.Workload
	if h := wp.GetHostname(); h != nil {
		key := workloadapi.ServiceKey(h.GetNamespace(), h.GetHostname())
		eps := candidates(t.ServiceWorkloads(key), src, nil)
		if len(eps) == 0 {
			return Route{}, fmt.Errorf("%w for waypoint %s", ErrNoEndpoint, key)
		}
		wpw = eps[pick(len(eps))]
	} else if a := wp.GetAddress(); a != nil {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return Route{}, errors.New("waypoint address is malformed")
		}
		wpw, _ = t.ByAddress(a.GetNetwork(), ip)
		if wpw == nil {
			return Route{}, fmt.Errorf("%w: waypoint %s unknown", ErrNoEndpoint, ip)
		}
	}
	port := uint16(wp.GetHboneMtlsPort())
	if port == 0 {
		port = hbonePort
	}
	return Route{Kind: HBONE, Addr: netip.AddrPortFrom(addrLike(wpw, dst.Addr()), port), Authority: dst.String(), Workload: wpw,
		Identities: []workloadapi.Identity{workloadapi.WorkloadIdentity(wpw)}, Waypoint: true}, nil
}

// isWaypoint reports whether src is the waypoint itself (its traffic
// must not loop back to it).
func isWaypoint(src *workloadapi.Workload, wp *workloadapi.GatewayAddress, t Table) bool {
	if a := wp.GetAddress(); a != nil {
		ip, _ := netip.AddrFromSlice(a.GetAddress())
		for _, b := range src.GetAddresses() {
			if x, _ := netip.AddrFromSlice(b); x.Unmap() == ip.Unmap() {
				return true
			}
		}
		return false
	}
	if h := wp.GetHostname(); h != nil {
		_, ok := src.GetServices()[workloadapi.ServiceKey(h.GetNamespace(), h.GetHostname())]
		return ok
	}
	return false
}

// candidates applies health and routing preferences (wire contract §5.5:
// STRICT keeps endpoints matching every scope, FAILOVER the best-matching
// prefix).
func candidates(all []*workloadapi.Workload, src *workloadapi.Workload, lb *workloadapi.LoadBalancing) []*workloadapi.Workload {
	var healthy []*workloadapi.Workload
	for _, w := range all {
		if len(w.GetAddresses()) == 0 {
			continue
		}
		if lb.GetHealthPolicy() != workloadapi.LoadBalancing_ALLOW_ALL && w.GetStatus() != workloadapi.WorkloadStatus_HEALTHY {
			continue
		}
		healthy = append(healthy, w)
	}
	prefs := lb.GetRoutingPreference()
	if len(prefs) == 0 {
		return healthy
	}
	best, out := -1, []*workloadapi.Workload(nil)
	for _, w := range healthy {
		rank := 0
		for _, scope := range prefs {
			if !sameScope(scope, src, w) {
				break
			}
			rank++
		}
		if lb.GetMode() == workloadapi.LoadBalancing_STRICT && rank < len(prefs) {
			continue
		}
		switch {
		case rank > best:
			best, out = rank, []*workloadapi.Workload{w}
		case rank == best:
			out = append(out, w)
		}
	}
	return out
}

func sameScope(s workloadapi.LoadBalancing_Scope, a, b *workloadapi.Workload) bool {
	switch s {
	case workloadapi.LoadBalancing_REGION:
		return a.GetLocality().GetRegion() == b.GetLocality().GetRegion()
	case workloadapi.LoadBalancing_ZONE:
		return a.GetLocality().GetZone() == b.GetLocality().GetZone()
	case workloadapi.LoadBalancing_SUBZONE:
		return a.GetLocality().GetSubzone() == b.GetLocality().GetSubzone()
	case workloadapi.LoadBalancing_NODE:
		return a.GetNode() == b.GetNode()
	case workloadapi.LoadBalancing_CLUSTER:
		return a.GetClusterId() == b.GetClusterId()
	case workloadapi.LoadBalancing_NETWORK:
		return a.GetNetwork() == b.GetNetwork()
	}
	return true
}

// targetPort maps a service port to the endpoint's port: the service's
// target port, else the workload's own mapping (named ports), else the
// service port.
func targetPort(svc *workloadapi.Service, w *workloadapi.Workload, key string, port uint16) uint16 {
	for _, p := range svc.GetPorts() {
		if p.GetServicePort() != uint32(port) {
			continue
		}
		if p.GetTargetPort() != 0 {
			return uint16(p.GetTargetPort())
		}
	}
	for _, p := range w.GetServices()[key].GetPorts() {
		if p.GetServicePort() == uint32(port) && p.GetTargetPort() != 0 {
			return uint16(p.GetTargetPort())
		}
	}
	return port
}

// addrLike is w's first address of like's family, else its first.
func addrLike(w *workloadapi.Workload, like netip.Addr) netip.Addr {
	var first netip.Addr
	for _, b := range w.GetAddresses() {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			continue
		}
		a = a.Unmap()
		if a.Is4() == like.Unmap().Is4() {
			return a
		}
		if !first.IsValid() {
			first = a
		}
	}
	return first
}
