package route

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// ErrSelfCall is a destination that is the node proxy itself: one of its
// own ports on a mesh address. Carrying it would make the proxy connect
// to its own listener, which captures the connection again: a loop that
// ends when the process runs out of file descriptors.
var ErrSelfCall = errors.New("destination is the node proxy itself")

// proxyPorts are the ports the node proxy holds in a pod and on the node
// (docs/wire-contract.md §4.1): no application can listen on them where
// the proxy does, so no connection to them is ever the app's.
var proxyPorts = []uint16{15000, 15001, 15006, 15008, 15020, 15021, 15053}

// IsProxyPort reports whether port is one of the node proxy's own.
func IsProxyPort(port uint16) bool { return slices.Contains(proxyPorts, port) }

// CheckInbound refuses an inbound destination (a CONNECT authority, a
// plaintext connection's original destination) that is one of the
// proxy's ports.
func CheckInbound(dst netip.AddrPort) error {
	if IsProxyPort(dst.Port()) {
		return fmt.Errorf("%w: %s", ErrSelfCall, dst)
	}
	return nil
}

// checkOutbound refuses a route that would reach a proxy port where a
// proxy listens: the source pod's own addresses, a mesh workload or
// service (an HBONE authority on a proxy port is refused at the other end
// anyway), or a plain TCP hop back into the source pod. Destinations
// outside the mesh may use these ports: no proxy of ours is there.
func checkOutbound(src *workloadapi.Workload, dst netip.AddrPort, inMesh bool, r Route) error {
	self := func(a netip.Addr) bool {
		for _, b := range src.GetAddresses() {
			if x, ok := netip.AddrFromSlice(b); ok && x.Unmap() == a.Unmap() {
				return true
			}
		}
		return false
	}
	if IsProxyPort(dst.Port()) && (inMesh || self(dst.Addr())) {
		return fmt.Errorf("%w: %s", ErrSelfCall, dst)
	}
	switch r.Kind {
	case HBONE:
		if a, err := netip.ParseAddrPort(r.Authority); err == nil && IsProxyPort(a.Port()) {
			return fmt.Errorf("%w: %s (through %s)", ErrSelfCall, a, dst)
		}
	case TCP:
		if IsProxyPort(r.Addr.Port()) && self(r.Addr.Addr()) {
			return fmt.Errorf("%w: %s (through %s)", ErrSelfCall, r.Addr, dst)
		}
	}
	return nil
}
