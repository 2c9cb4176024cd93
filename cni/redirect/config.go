// Package redirect installs, verifies and removes the in-pod traffic
// redirection of ambient mode (docs/wire-contract.md §4), and the sidecar
// capture of sidecar-injected pods (sidecar.go): inside an ambient pod's
// network namespace, outbound TCP goes to the node proxy's 15001, inbound TCP
// (except HBONE on 15008) to 15006, DNS to 15053; the proxy's own marked
// traffic and kubelet probes pass; replies of the proxy's transparent sockets
// are routed locally through table 100. IPv4 and IPv6 alike: a pod's IPv6 is
// captured, or the pod is refused (cni/README.md, "IPv6 in enrolled pods").
//
// A pod is in one mode at a time: enrolling it in one removes the other's
// rules.
//
// Rules are data first (pure and golden-tested), then a Backend
// applies them in a netns: nftables over netlink (the default) or
// iptables-restore. Every backend is idempotent and can Verify what the
// kernel holds against what it would install.
package redirect

import (
	"fmt"
	"net/netip"
	"slices"
)

// Constants of wire contract §4.1.
const (
	// ProxyMark is the mark the node proxy sets (SO_MARK) on its sockets.
	ProxyMark = 0x539
	// TProxyMark is the connmark of connections the proxy opened.
	TProxyMark = 0x111
	// MarkMask masks both marks.
	MarkMask = 0xfff
	// RouteTable and RulePriority route TProxyMark'ed replies locally.
	RouteTable   = 100
	RulePriority = 32764

	OutboundPort = 15001
	InboundPort  = 15006
	HBONEPort    = 15008
	DNSPort      = 15053
)

// DefaultProbeSNAT and DefaultProbeSNATv6 are the addresses kubelet probes
// are SNATed to on the host, which the in-pod rules let through (wire
// contract §4.1; Istio's HOST_PROBE_SNAT_IP and HOST_PROBE_SNAT_IPV6). The
// IPv6 one is in a ULA range no cluster is expected to number pods from.
var (
	DefaultProbeSNAT   = netip.MustParseAddr("169.254.7.127")
	DefaultProbeSNATv6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
)

// PodConfig is what varies between pods (wire contract §4.2, per-pod
// overrides).
type PodConfig struct {
	// DNSCapture redirects DNS (UDP and TCP port 53) to 15053.
	DNSCapture bool
	// InboundCapture redirects inbound TCP to 15006; off for the
	// ambient.istio.io/bypass-inbound-capture annotation.
	InboundCapture bool
	// RerouteInterfaces send all TCP arriving on them to 15001 (the
	// istio.io/reroute-virtual-interfaces annotation).
	RerouteInterfaces []string
	// ProbeSNAT and ProbeSNATv6 are the kubelet probe source addresses of
	// each family.
	ProbeSNAT, ProbeSNATv6 netip.Addr

	// Sidecar, when set, makes the pod a sidecar pod: its sidecar capture
	// is installed instead of the ambient redirection, and the fields
	// above are ignored.
	Sidecar *SidecarConfig
}

// DefaultPodConfig captures inbound, outbound and DNS.
func DefaultPodConfig() PodConfig {
	return PodConfig{DNSCapture: true, InboundCapture: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6}
}

// Validate reports a configuration no backend can apply.
func (c PodConfig) Validate() error {
	if c.Sidecar != nil {
		if err := c.Sidecar.Validate(); err != nil {
			return fmt.Errorf("sidecar capture: %w", err)
		}
		return nil
	}
	if !c.ProbeSNAT.Is4() {
		return fmt.Errorf("probe SNAT address %v is not IPv4", c.ProbeSNAT)
	}
	// A v4-mapped address would make an IPv6 rule that no packet matches.
	if !c.ProbeSNATv6.Is6() || c.ProbeSNATv6.Is4In6() || c.ProbeSNATv6.Zone() != "" {
		return fmt.Errorf("probe SNAT address %v is not IPv6", c.ProbeSNATv6)
	}
	for _, i := range c.RerouteInterfaces {
		if i == "" || len(i) > 15 {
			return fmt.Errorf("interface name %q: want 1 to 15 bytes", i)
		}
	}
	return nil
}

// Equal reports whether c and o install the same rules.
func (c PodConfig) Equal(o PodConfig) bool {
	if c.Sidecar != nil || o.Sidecar != nil {
		return c.Sidecar.Equal(o.Sidecar)
	}
	return c.DNSCapture == o.DNSCapture && c.InboundCapture == o.InboundCapture &&
		c.ProbeSNAT == o.ProbeSNAT && c.ProbeSNATv6 == o.ProbeSNATv6 && slices.Equal(c.RerouteInterfaces, o.RerouteInterfaces)
}
