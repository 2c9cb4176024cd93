package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Sidecar capture (docs/sidecar-injection.md, "Redirection by the CNI
// agent"): the rules a sidecar-injected pod's init container would have
// installed, installed instead by the agent from outside the pod. Outbound
// TCP goes to Envoy's 15001, inbound TCP to 15006; the proxy's own sockets
// (its UID and GID) pass, and so do the proxy's ports.

// Ports of the sidecar proxy that inbound capture never takes: HBONE
// (HBONEPort), pilot-agent's status port, Envoy's readiness and its
// Prometheus port. The pod's own status port (status.sidecar.istio.io/port)
// comes on top, through SidecarConfig.ExcludeInboundPorts.
const (
	SidecarStatusPort    = 15020
	SidecarReadinessPort = 15021
	SidecarEnvoyPromPort = 15090
)

// DefaultProxyID is the UID and GID istio-proxy runs as unless its
// container says otherwise.
const DefaultProxyID = 1337

// Table names of the sidecar nftables rules, as the sidecar's own
// nftables capture names them.
const (
	SidecarNatTable    = "istio-proxy-nat"
	SidecarMangleTable = "istio-proxy-mangle"
	SidecarRawTable    = "istio-proxy-raw"
)

// Ranges is a set of destination addresses: every address, or the
// prefixes listed (each family's own; a list with only IPv6 prefixes
// captures no IPv4).
type Ranges struct {
	All      bool
	Prefixes []netip.Prefix
}

// Ports is a set of ports: every port, or the ports listed.
type Ports struct {
	All   bool
	Ports []uint16
}

// SidecarConfig is the sidecar capture of one pod. The zero value captures
// nothing outbound or inbound; DefaultSidecarConfig is what a pod without
// annotations gets.
type SidecarConfig struct {
	// ProxyUID and ProxyGID own the proxy's sockets. Their traffic is not
	// captured, except to the pod's own addresses over lo, which goes to
	// the inbound listener as any other inbound connection.
	ProxyUID, ProxyGID uint32
	// IncludeOutbound are the destinations captured outbound, after
	// ExcludeOutbound.
	IncludeOutbound Ranges
	ExcludeOutbound []netip.Prefix
	// IncludeInbound are the local ports captured inbound. A port of
	// ExcludeInboundPorts is never captured, nor are 15008, 15020, 15021
	// and 15090, whatever the lists say.
	IncludeInbound      Ports
	ExcludeInboundPorts []uint16
	// IncludeOutboundPorts are captured whatever their destination (but
	// for ExcludeOutbound); ExcludeOutboundPorts, TCP and UDP, never are.
	IncludeOutboundPorts []uint16
	ExcludeOutboundPorts []uint16
	// RerouteInterfaces (a VM's tap devices) send the TCP arriving on them
	// to 15001, as outbound traffic of the pod; ExcludeInterfaces are not
	// captured in either direction.
	RerouteInterfaces []string
	ExcludeInterfaces []string
	// DNSCapture sends DNS (UDP and TCP port 53) of every process but the
	// proxy to pilot-agent's 15053.
	DNSCapture bool
	// DropInvalid drops packets conntrack finds invalid (out of window)
	// rather than letting them reset connections.
	DropInvalid bool
}

// DefaultSidecarConfig captures every outbound address and every inbound
// port, as a pod without traffic annotations gets.
func DefaultSidecarConfig() *SidecarConfig {
	return &SidecarConfig{
		ProxyUID: DefaultProxyID, ProxyGID: DefaultProxyID,
		IncludeOutbound:      Ranges{All: true},
		IncludeInbound:       Ports{All: true},
		ExcludeInboundPorts:  []uint16{SidecarStatusPort},
		ExcludeOutboundPorts: []uint16{SidecarStatusPort},
	}
}

// Validate reports a sidecar configuration no backend can apply.
func (c *SidecarConfig) Validate() error {
	// UID 0 would let every root process of the pod around the proxy.
	if c.ProxyUID == 0 || c.ProxyGID == 0 {
		return errors.New("proxy UID and GID must not be 0")
	}
	if c.IncludeOutbound.All && len(c.IncludeOutbound.Prefixes) > 0 {
		return errors.New("outbound ranges: every address and a list at once")
	}
	if c.IncludeInbound.All && len(c.IncludeInbound.Ports) > 0 {
		return errors.New("inbound ports: every port and a list at once")
	}
	for _, p := range slices.Concat(c.IncludeOutbound.Prefixes, c.ExcludeOutbound) {
		if !p.IsValid() {
			return fmt.Errorf("invalid prefix %v", p)
		}
	}
	for _, p := range slices.Concat(c.IncludeInbound.Ports, c.ExcludeInboundPorts, c.IncludeOutboundPorts, c.ExcludeOutboundPorts) {
		if p == 0 {
			return errors.New("port 0")
		}
	}
	for _, i := range slices.Concat(c.RerouteInterfaces, c.ExcludeInterfaces) {
		if err := ValidateInterfaceName(i); err != nil {
			return err
		}
	}
	return nil
}

// ValidateInterfaceName accepts the names the kernel and both backends
// take the same way: 1 to 15 bytes, a letter first, then letters, digits,
// '_', '.' and '-'. Anything else would be a rule that matches another
// interface than meant, or none.
func ValidateInterfaceName(name string) error {
	if name == "" || len(name) > 15 {
		return fmt.Errorf("interface name %q: want 1 to 15 bytes", name)
	}
	for i, r := range name {
		letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		ok := letter || (i > 0 && ((r >= '0' && r <= '9') || r == '_' || r == '.' || r == '-'))
		if !ok {
			return fmt.Errorf("interface name %q: want a letter, then letters, digits, '_', '.' or '-'", name)
		}
	}
	return nil
}

// Equal reports whether c and o install the same rules. Nil is equal only
// to nil.
func (c *SidecarConfig) Equal(o *SidecarConfig) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.ProxyUID == o.ProxyUID && c.ProxyGID == o.ProxyGID &&
		c.IncludeOutbound.All == o.IncludeOutbound.All && slices.Equal(c.IncludeOutbound.Prefixes, o.IncludeOutbound.Prefixes) &&
		slices.Equal(c.ExcludeOutbound, o.ExcludeOutbound) &&
		c.IncludeInbound.All == o.IncludeInbound.All && slices.Equal(c.IncludeInbound.Ports, o.IncludeInbound.Ports) &&
		slices.Equal(c.ExcludeInboundPorts, o.ExcludeInboundPorts) &&
		slices.Equal(c.IncludeOutboundPorts, o.IncludeOutboundPorts) && slices.Equal(c.ExcludeOutboundPorts, o.ExcludeOutboundPorts) &&
		slices.Equal(c.RerouteInterfaces, o.RerouteInterfaces) && slices.Equal(c.ExcludeInterfaces, o.ExcludeInterfaces) &&
		c.DNSCapture == o.DNSCapture && c.DropInvalid == o.DropInvalid
}
