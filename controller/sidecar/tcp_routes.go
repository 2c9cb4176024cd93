package sidecar

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	mongov3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/mongo_proxy/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	hashpolicyv3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// tcpChain is one filter chain of an outbound TCP or TLS port: the
// destination prefixes and server names it matches (none: every
// connection) and the filters that carry the connection.
type tcpChain struct {
	prefixes    []*corev3.CidrRange
	serverNames []string
	filters     []*listenerv3.Filter
	// from is the VirtualService the chain's route is of, named in the
	// chain's metadata as istiod names it (not for destination subnets).
	from *networkingv1.VirtualService
}

// metadata names the VirtualService the chain comes from, if any.
func (c tcpChain) metadata() *corev3.Metadata {
	if c.from == nil {
		return nil
	}
	return configMetadata(c.from)
}

// match is the chain's filter chain match, nil when it matches every
// connection.
func (c tcpChain) match() *listenerv3.FilterChainMatch {
	if len(c.prefixes) == 0 && len(c.serverNames) == 0 {
		return nil
	}
	return &listenerv3.FilterChainMatch{PrefixRanges: c.prefixes, ServerNames: c.serverNames}
}

// tcpChains are the filter chains of port of svc (a TCP, TLS or HTTPS
// port, of protocol protocol) for proxy p, as istiod builds them from the
// VirtualServices for the host; prefixes are the service's addresses when
// the listener is not bound to one address (bound).
//
// A TLS or HTTPS port takes the tls routes whose match applies, one chain
// per distinct server names and destination subnets (the first wins), else
// the port's own cluster, matched by the service's name when nothing else
// tells it apart. Any other port takes the tcp routes in order: a route
// without a match, or with a match without destination subnets, takes every
// remaining connection and ends the list; matches with destination subnets
// add a chain for them; the port's own cluster takes the rest.
func (m *Mesh) tcpChains(p Proxy, svc *Service, port uint32, protocol string, prefixes []*corev3.CidrRange, bound bool) []tcpChain {
	vss := m.VirtualServices(p, svc.GetHostname())
	if protocol == "TLS" || protocol == "HTTPS" {
		var out []tcpChain
		seen := map[string]bool{}
		for _, vs := range vss {
			for _, tr := range vs.Spec.GetTls() {
				if len(tr.GetRoute()) == 0 {
					continue
				}
				for _, mr := range tr.GetMatch() {
					if !l4MatchApplies(mr.GetPort(), mr.GetGateways(), mr.GetSourceLabels(), mr.GetSourceNamespace(), p, port) {
						continue
					}
					ranges := prefixes
					if len(mr.GetDestinationSubnets()) > 0 {
						ranges = cidrRanges(mr.GetDestinationSubnets())
					}
					key := strings.Join(mr.GetSniHosts(), ",") + "|" + strings.Join(mr.GetDestinationSubnets(), ",")
					if seen[key] {
						continue // the same connections are already routed
					}
					seen[key] = true
					out = append(out, tcpChain{prefixes: ranges, serverNames: mr.GetSniHosts(), filters: m.tcpRouteFilters(p, vs, tr.GetRoute(), port, protocol), from: vs})
				}
			}
		}
		if len(out) > 0 {
			return out
		}
		own := tcpChain{prefixes: prefixes, filters: m.ownTCPFilters(p, svc, port, protocol)}
		if !bound && len(prefixes) == 0 {
			// Only the name tells this service's connections apart on
			// a wildcard listener.
			own.serverNames = []string{svc.GetHostname()}
		}
		return []tcpChain{own}
	}

	var out []tcpChain
	ownTaken := false
routes:
	for _, vs := range vss {
		for _, tr := range vs.Spec.GetTcp() {
			if len(tr.GetRoute()) == 0 {
				continue
			}
			if len(tr.GetMatch()) == 0 {
				return append(out, tcpChain{prefixes: prefixes, filters: m.tcpRouteFilters(p, vs, tr.GetRoute(), port, protocol), from: vs})
			}
			var subnets []string
			for _, mr := range tr.GetMatch() {
				if !l4MatchApplies(mr.GetPort(), mr.GetGateways(), mr.GetSourceLabels(), mr.GetSourceNamespace(), p, port) {
					continue
				}
				if len(mr.GetDestinationSubnets()) == 0 {
					out = append(out, tcpChain{prefixes: prefixes, filters: m.tcpRouteFilters(p, vs, tr.GetRoute(), port, protocol), from: vs})
					break routes
				}
				subnets = append(subnets, mr.GetDestinationSubnets()...)
			}
			if len(subnets) > 0 {
				out = append(out, tcpChain{prefixes: cidrRanges(subnets), filters: m.tcpRouteFilters(p, vs, tr.GetRoute(), port, protocol)})
				if sameRanges(cidrRanges(subnets), prefixes) {
					// The service's own chain would match the same
					// connections (Envoy refuses two such chains): it is
					// left out; later routes still add theirs.
					ownTaken = true
				}
			}
		}
	}
	if ownTaken || len(out) > 0 && out[len(out)-1].match() == nil {
		return out
	}
	return append(out, tcpChain{prefixes: prefixes, filters: m.ownTCPFilters(p, svc, port, protocol)})
}

// l4MatchApplies reports whether a tcp or tls route's match applies to
// proxy p's traffic to port: its port, gateways (sidecars are "mesh"),
// source labels and source namespace, all known when the config is built.
func l4MatchApplies(matchPort uint32, gateways []string, sourceLabels map[string]string, sourceNamespace string, p Proxy, port uint32) bool {
	if matchPort != 0 && matchPort != port {
		return false
	}
	if len(gateways) > 0 && !slices.Contains(gateways, "mesh") {
		return false
	}
	if !selects(sourceLabels, p.Labels) {
		return false
	}
	return sourceNamespace == "" || sourceNamespace == p.Namespace
}

// ownTCPFilters carry a connection to the port's own cluster (the
// service's only port's when it has one, as istiod names it).
func (m *Mesh) ownTCPFilters(p Proxy, svc *Service, port uint32, protocol string) []*listenerv3.Filter {
	target := port
	if ports := sortedPorts(svc); len(ports) == 1 {
		target = ports[0]
	}
	cluster := ClusterName(Outbound, target, "", svc.GetHostname())
	dr := m.usableRule(p, svc)
	return tcpFilters(&tcpproxyv3.TcpProxy{StatPrefix: cluster, ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster}}, dr, "", protocol)
}

// tcpRouteFilters carry a connection along a route's destinations: to one
// cluster, or split by weight (those of weight 0 take none). The rule of
// the first destination's service sets the idle timeout, the longest
// connection, source-address hashing and tunnelling.
func (m *Mesh) tcpRouteFilters(p Proxy, vs *networkingv1.VirtualService, routes []*networkingapi.RouteDestination, port uint32, protocol string) []*listenerv3.Filter {
	first := fqdn(routes[0].GetDestination().GetHost(), vs.Namespace, m.DomainSuffix)
	var dr *networkingv1.DestinationRule
	if svc := m.Service(p, first); svc != nil {
		dr = m.usableRule(p, svc)
	}
	if len(routes) == 1 {
		cluster := m.destinationCluster(p, routes[0].GetDestination(), vs.Namespace, port)
		tp := &tcpproxyv3.TcpProxy{StatPrefix: cluster, ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster}}
		return tcpFilters(tp, dr, routes[0].GetDestination().GetSubset(), protocol)
	}
	weighted := &tcpproxyv3.TcpProxy_WeightedCluster{}
	for _, r := range routes {
		if r.GetWeight() > 0 {
			weighted.Clusters = append(weighted.Clusters, &tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{
				Name: m.destinationCluster(p, r.GetDestination(), vs.Namespace, port), Weight: uint32(r.GetWeight()),
			})
		}
	}
	tp := &tcpproxyv3.TcpProxy{StatPrefix: vs.Name + "." + vs.Namespace, ClusterSpecifier: &tcpproxyv3.TcpProxy_WeightedClusters{WeightedClusters: weighted}}
	return tcpFilters(tp, dr, "", protocol)
}

// destinationCluster is the cluster a route destination names: its port,
// else its service's only port, else the listener's port.
func (m *Mesh) destinationCluster(p Proxy, d *networkingapi.Destination, vsNamespace string, port uint32) string {
	host := fqdn(d.GetHost(), vsNamespace, m.DomainSuffix)
	switch {
	case d.GetPort().GetNumber() != 0:
		port = d.GetPort().GetNumber()
	default:
		if svc := m.Service(p, host); svc != nil {
			if ports := sortedPorts(svc); len(ports) == 1 {
				port = ports[0]
			}
		}
	}
	return ClusterName(Outbound, port, d.GetSubset(), host)
}

// usableRule is the DestinationRule proxy p applies to svc, nil when none
// does or it was refused.
func (m *Mesh) usableRule(p Proxy, svc *Service) *networkingv1.DestinationRule {
	dr := m.DestinationRule(p, svc.GetHostname(), svc.GetNamespace())
	if m.refused(dr) {
		return nil
	}
	return dr
}

// tcpFilters finish a TCP proxy with its DestinationRule's connection
// limits, hashing and tunnel (subset's, for one subset), behind the
// protocol's own filter (Mongo's statistics).
func tcpFilters(tp *tcpproxyv3.TcpProxy, dr *networkingv1.DestinationRule, subsetName, protocol string) []*listenerv3.Filter {
	policy := rulePolicy(dr)
	tcp := policy.GetConnectionPool().GetTcp()
	tp.IdleTimeout = tcp.GetIdleTimeout()
	tp.MaxDownstreamConnectionDuration = tcp.GetMaxConnectionDuration()
	if sourceIPHash(dr, subsetName) {
		tp.HashPolicy = []*hashpolicyv3.HashPolicy{{PolicySpecifier: &hashpolicyv3.HashPolicy_SourceIp_{SourceIp: &hashpolicyv3.HashPolicy_SourceIp{}}}}
	}
	tunnel := policy.GetTunnel()
	if subsetName != "" {
		tunnel = subset(dr, subsetName).GetTrafficPolicy().GetTunnel()
	}
	if tunnel != nil {
		tp.TunnelingConfig = &tcpproxyv3.TcpProxy_TunnelingConfig{
			Hostname: net.JoinHostPort(tunnel.GetTargetHost(), strconv.FormatUint(uint64(tunnel.GetTargetPort()), 10)),
			UsePost:  tunnel.GetProtocol() == "POST",
		}
	}
	filter := &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(tp)}}
	if protocol == "Mongo" {
		return []*listenerv3.Filter{{Name: "envoy.filters.network.mongo_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&mongov3.MongoProxy{
			StatPrefix: tp.GetStatPrefix(),
		})}}, filter}
	}
	return []*listenerv3.Filter{filter}
}

// sourceIPHash reports a rule (or its subset, which decides when it sets a
// load balancer) that hashes on the source address, which a TCP proxy can
// do by itself.
func sourceIPHash(dr *networkingv1.DestinationRule, subsetName string) bool {
	use := rulePolicy(dr).GetLoadBalancer().GetConsistentHash().GetUseSourceIp()
	if lb := subset(dr, subsetName).GetTrafficPolicy().GetLoadBalancer(); subsetName != "" && lb != nil {
		use = lb.GetConsistentHash().GetUseSourceIp()
	}
	return use
}

// cidrRanges parses destination subnets ("10.0.0.0/8", or one address);
// one that does not parse was refused by validation and is left out.
func cidrRanges(subnets []string) []*corev3.CidrRange {
	var out []*corev3.CidrRange
	for _, s := range subnets {
		if pfx, err := parsePrefix(s); err == nil {
			out = append(out, &corev3.CidrRange{AddressPrefix: pfx.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(pfx.Bits()))})
		}
	}
	return out
}

// parsePrefix parses a subnet, or one address as the subnet of itself.
func parsePrefix(s string) (netip.Prefix, error) {
	if pfx, err := netip.ParsePrefix(s); err == nil {
		return pfx.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// rulePolicy is a rule's top-level traffic policy; nil for no rule.
func rulePolicy(dr *networkingv1.DestinationRule) *networkingapi.TrafficPolicy {
	if dr == nil {
		return nil
	}
	return dr.Spec.GetTrafficPolicy()
}

// sameRanges compares two sets of ranges, in any order.
func sameRanges(a, b []*corev3.CidrRange) bool {
	key := func(rs []*corev3.CidrRange) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.GetAddressPrefix()+"/"+strconv.FormatUint(uint64(r.GetPrefixLen().GetValue()), 10))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}
