package sidecar

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	udpatypev1 "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	grpcwebv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_web/v3"
	httpinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	originaldstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	securityapi "istio.io/api/security/v1beta1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// The sidecar's own listeners (sidecar wire contract §4).
const (
	VirtualOutbound     = "virtualOutbound"
	VirtualInbound      = "virtualInbound"
	virtualOutboundPort = 15001
	virtualInboundPort  = 15006
)

// Application protocols the listeners match on.
var (
	plainHTTPProtocols = []string{"http/1.1", "h2c"}
	mtlsHTTPProtocols  = []string{"istio-http/1.0", "istio-http/1.1", "istio-h2"}
	mtlsTCPProtocols   = []string{"istio-peer-exchange", "istio"}
	// mtlsAnyProtocols: what a port known to be HTTP takes over mutual TLS.
	mtlsAnyProtocols = []string{"istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"}
)

// SidecarListeners are every listener a sidecar gets: its outbound
// listeners, and virtualInbound with a chain set per target port its
// workload serves.
func (m *Mesh) SidecarListeners(p Proxy) []Named {
	return append(m.sidecarOutboundListeners(p), Named{VirtualInbound, m.virtualInbound(p)})
}

// sidecarOutboundListeners are the listeners of every sidecar of p's
// namespace and Sidecar scope: the outbound listeners of the services it
// may see (bound to no port: virtualOutbound hands them the connections
// redirected to 15001), and virtualOutbound.
func (m *Mesh) sidecarOutboundListeners(p Proxy) []Named {
	byName := map[string]*listenerv3.Listener{}
	var order []string
	add := func(l *listenerv3.Listener) *listenerv3.Listener {
		if old := byName[l.Name]; old != nil {
			return old
		}
		byName[l.Name] = l
		order = append(order, l.Name)
		return l
	}
	for _, svc := range m.visibleServices(p) {
		for _, port := range sortedPorts(svc) {
			protocol := portProtocol(svc, port)
			if k := kindOf(protocol); (k == kindTCP || k == kindSniffed) && m.perInstance(svc) {
				// One listener per endpoint address, as istiod builds
				// them for headless services: each is told apart by its
				// destination, which a wildcard listener cannot do.
				if ips, ok := m.instanceAddresses(svc, port); ok {
					for _, ip := range ips {
						if len(p.IPs) > 0 && p.IPs[0].Unmap() == ip {
							continue // its own: the app calls itself directly
						}
						if k == kindTCP {
							add(m.boundTCPListener(p, svc, ip, port, protocol))
						} else {
							add(sniffedOutboundListener(svc, ip, port))
						}
					}
					continue
				}
			}
			switch kindOf(protocol) {
			case kindHTTP:
				add(httpOutboundListener(port, protocol))
			case kindTCP:
				m.addTCPOutbound(p, add, svc, port, protocol)
			case kindSniffed:
				ip, ok := netip.Addr{}, false
				if addrs := sidecarAddresses(svc); len(addrs) > 0 {
					ip, ok = netip.AddrFromSlice(addrs[0].GetAddress())
					ip = ip.Unmap()
				}
				if !ok {
					// Without an address nothing tells its traffic apart
					// from other services' on the port: HTTP by host.
					add(httpOutboundListener(port, ""))
					continue
				}
				add(sniffedOutboundListener(svc, ip, port))
			}
		}
	}
	out := make([]Named, 0, len(order)+2)
	for _, n := range order {
		out = append(out, Named{n, byName[n]})
	}
	boundHandshakes(out)
	out = append(out, Named{VirtualOutbound, virtualOutbound()})
	if p.HBONE {
		out = append(out, Named{ConnectOriginate, connectOriginateListener()})
	}
	return out
}

func listenerName(ip string, port uint32) string { return ip + "_" + u32(port) }

func outboundListener(ip string, port uint32) *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:             listenerName(ip, port),
		Address:          socketAddress(ip, port),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		BindToPort:       wrapperspb.Bool(false),
		// Listener filters (inspectors) wait for nothing: a client that
		// speaks last is matched on what is known.
		ListenerFiltersTimeout:           durationpb.New(0),
		ContinueOnListenerFiltersTimeout: true,
	}
}

// transportSocketConnectTimeout bounds a TLS handshake on an outbound
// chain.
const transportSocketConnectTimeout = 15 * time.Second

// boundHandshakes gives every chain of the outbound listeners but the
// passthrough ones a handshake deadline, as istiod does.
func boundHandshakes(ls []Named) {
	for _, n := range ls {
		l := n.Resource.(*listenerv3.Listener)
		for _, fc := range append(slices.Clone(l.GetFilterChains()), l.GetDefaultFilterChain()) {
			if fc != nil && fc.GetName() != passthroughChainName {
				fc.TransportSocketConnectTimeout = durationpb.New(transportSocketConnectTimeout)
			}
		}
	}
}

// httpOutboundListener serves every HTTP service on port by host, over
// the route configuration named after the port; anything not HTTP passes
// through.
func httpOutboundListener(port uint32, protocol string) *listenerv3.Listener {
	l := outboundListener("0.0.0.0", port)
	l.ListenerFilters = []*listenerv3.ListenerFilter{httpInspector()}
	l.FilterChains = []*listenerv3.FilterChain{{
		FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: plainHTTPProtocols},
		Filters:          []*listenerv3.Filter{outboundHCM(u32(port), port, protocol)},
	}}
	l.DefaultFilterChain = passthroughChain()
	return l
}

// addTCPOutbound adds a TCP service's listener with the chains of its
// VirtualServices' tcp or tls routes and its own (tcpChains): on its
// address; else, for a service of several addresses or ranges, on the port
// with chains matching them; else, for TLS, on the port with a chain
// matching its hostname as SNI; else on the port for everything not
// matched otherwise. A chain whose match another service's chain on the
// port already has is left out (Envoy refuses two).
func (m *Mesh) addTCPOutbound(p Proxy, add func(*listenerv3.Listener) *listenerv3.Listener, svc *Service, port uint32, protocol string) {
	addrs := sidecarAddresses(svc)
	if len(addrs) == 1 {
		if ip, ok := netip.AddrFromSlice(addrs[0].GetAddress()); ok && (addrs[0].GetLength() == 0 || int(addrs[0].GetLength()) == ip.BitLen()) {
			add(m.boundTCPListener(p, svc, ip.Unmap(), port, protocol))
			return
		}
	}
	var prefixes []*corev3.CidrRange
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
			ip = ip.Unmap()
			bits := uint32(a.GetLength())
			if bits == 0 {
				bits = uint32(ip.BitLen())
			}
			prefixes = append(prefixes, &corev3.CidrRange{AddressPrefix: ip.String(), PrefixLen: wrapperspb.UInt32(bits)})
		}
	}
	l := add(outboundListener("0.0.0.0", port))
	for _, c := range m.tcpChains(p, svc, port, protocol, prefixes, false) {
		match := c.match()
		if slices.ContainsFunc(l.FilterChains, func(fc *listenerv3.FilterChain) bool { return proto.Equal(fc.GetFilterChainMatch(), match) }) {
			continue // another service's chain takes these connections
		}
		if len(c.serverNames) > 0 && !slices.ContainsFunc(l.ListenerFilters, func(f *listenerv3.ListenerFilter) bool { return f.GetName() == tlsInspectorName }) {
			l.ListenerFilters = append(l.ListenerFilters, tlsInspector())
		}
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{FilterChainMatch: match, Filters: c.filters, Metadata: c.metadata()})
		if l.DefaultFilterChain == nil && match != nil {
			l.DefaultFilterChain = passthroughChain()
		}
	}
}

// boundTCPListener is a TCP service port's listener on one address: its
// chains, the catch-all one as the default after chains that match, and
// the passthrough as the default when every chain matches.
func (m *Mesh) boundTCPListener(p Proxy, svc *Service, ip netip.Addr, port uint32, protocol string) *listenerv3.Listener {
	l := outboundListener(ip.String(), port)
	for i, c := range m.tcpChains(p, svc, port, protocol, nil, true) {
		fc := &listenerv3.FilterChain{FilterChainMatch: c.match(), Filters: c.filters, Metadata: c.metadata()}
		if len(c.serverNames) > 0 && !slices.ContainsFunc(l.ListenerFilters, func(f *listenerv3.ListenerFilter) bool { return f.GetName() == tlsInspectorName }) {
			l.ListenerFilters = append(l.ListenerFilters, tlsInspector())
		}
		if fc.FilterChainMatch == nil && i > 0 {
			l.DefaultFilterChain = fc
			continue
		}
		l.FilterChains = append(l.FilterChains, fc)
	}
	if l.DefaultFilterChain == nil && l.FilterChains[len(l.FilterChains)-1].FilterChainMatch != nil {
		l.DefaultFilterChain = passthroughChain()
	}
	return l
}

// perInstance reports a service without an address that sends to the
// original destination (a headless Service, a ServiceEntry of resolution
// NONE): its TCP ports get a listener per endpoint address.
func (m *Mesh) perInstance(svc *Service) bool {
	return (svc.Info.Resolution == None || m.isHeadless(svc)) && len(sidecarAddresses(svc)) == 0
}

// instanceAddresses are the first addresses of a per-instance service's
// endpoints on port, sorted; false when the service falls back to a
// wildcard listener (a ServiceEntry without endpoints: nothing tells its
// addresses).
func (m *Mesh) instanceAddresses(svc *Service, port uint32) ([]netip.Addr, bool) {
	var out []netip.Addr
	for _, ep := range m.endpointsOf(svc) {
		if _, ok := ep.Ports[port]; !ok || len(ep.GetAddresses()) == 0 {
			continue
		}
		if a, ok := netip.AddrFromSlice(ep.GetAddresses()[0]); ok {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && !m.isKubernetesService(svc.Service) {
		return nil, false
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), true
}

// headlessSelf is the proxy's address when it is an endpoint of a
// per-instance service, whose listeners leave the proxy's own address out;
// "" otherwise.
func (m *Mesh) headlessSelf(p Proxy) string {
	for _, ref := range m.ownEndpoints(p) {
		if m.perInstance(ref.svc) && len(p.IPs) > 0 {
			return p.IPs[0].Unmap().String()
		}
	}
	return ""
}

// sidecarAddresses are the addresses a sidecar captures a service by:
// none for addresses the mesh allocated (a sidecar resolves those names
// only with DNS capture, which Canopy does not configure for sidecars).
func sidecarAddresses(svc *Service) []*workloadapi.NetworkAddress {
	if svc.Info.AutoAllocated {
		return nil
	}
	return svc.GetAddresses()
}

const tlsInspectorName = "envoy.filters.listener.tls_inspector"

// tlsInspector reads the ClientHello's server name and ALPN from at most
// 512 bytes at first (istiod's size).
func tlsInspector() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{Name: tlsInspectorName, ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspectorv3.TlsInspector{
		InitialReadBufferSize: wrapperspb.UInt32(512),
	})}}
}

// metadataExchange is Istio's peer metadata exchange, a filter of Istio's
// own Envoy build that its telemetry reads.
func metadataExchange() *listenerv3.Filter {
	return &listenerv3.Filter{Name: "istio.metadata_exchange", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: metadataExchangeConfig()}}
}

func metadataExchangeConfig() *anypb.Any {
	v, err := structpb.NewStruct(map[string]any{"protocol": "istio-peer-exchange", "enable_discovery": true})
	if err != nil {
		panic(err)
	}
	return mustAny(&udpatypev1.TypedStruct{TypeUrl: "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange", Value: v})
}

// sniffedOutboundListener carries a port of unknown protocol on the
// service's address: HTTP by its own route configuration, anything else
// as TCP.
func sniffedOutboundListener(svc *Service, ip netip.Addr, port uint32) *listenerv3.Listener {
	l := outboundListener(ip.String(), port)
	l.ListenerFilters = []*listenerv3.ListenerFilter{httpInspector()}
	route := svc.GetHostname() + ":" + u32(port)
	l.FilterChains = []*listenerv3.FilterChain{{
		FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: plainHTTPProtocols},
		Filters:          []*listenerv3.Filter{outboundHCM(route, port, "")},
	}}
	l.DefaultFilterChain = &listenerv3.FilterChain{Filters: []*listenerv3.Filter{tcpProxy(ClusterName(Outbound, port, "", svc.GetHostname()))}}
	return l
}

const passthroughChainName = "PassthroughFilterChain"

func passthroughChain() *listenerv3.FilterChain {
	return &listenerv3.FilterChain{Name: passthroughChainName, FilterChainMatch: &listenerv3.FilterChainMatch{}, Filters: []*listenerv3.Filter{tcpProxy(PassthroughCluster)}}
}

func tcpProxy(cluster string) *listenerv3.Filter {
	return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
		StatPrefix: cluster, ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
	})}}
}

func httpInspector() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{Name: "envoy.filters.listener.http_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&httpinspectorv3.HttpInspector{})}}
}

// outboundHCM routes by the route configuration route over ADS; a
// gRPC-Web port's (the protocol of the first service that made the
// port's listener, as in istiod) translates gRPC-Web.
func outboundHCM(route string, port uint32, protocol string) *listenerv3.Filter {
	filters := []*hcmv3.HttpFilter{faultFilter(), corsFilter(), routerFilter()}
	if protocol == "GRPC-Web" {
		filters = append([]*hcmv3.HttpFilter{grpcWebFilter()}, filters...)
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "outbound_0.0.0.0_" + u32(port),
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: adsSourceNoWait(), RouteConfigName: route,
		}},
		HttpFilters:                  filters,
		UseRemoteAddress:             wrapperspb.Bool(false),
		NormalizePath:                wrapperspb.Bool(true),
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_KEEP_UNCHANGED,
		StreamIdleTimeout:            durationpb.New(0),
		UpgradeConfigs:               []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}},
		Proxy_100Continue:            true,
	}
	return hcmFilter(hcm)
}

func hcmFilter(hcm *hcmv3.HttpConnectionManager) *listenerv3.Filter {
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)}}
}

func faultFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.fault", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&faultv3.HTTPFault{})}}
}

// corsFilter answers CORS preflights and checks origins as each route's
// CORS policy says (none: it does nothing).
func corsFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.cors", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&corsv3.Cors{})}}
}

// grpcWebFilter translates gRPC-Web requests to gRPC for the application.
func grpcWebFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.grpc_web", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&grpcwebv3.GrpcWeb{})}}
}

// virtualOutbound takes the connections redirected to 15001 and hands
// each to the listener of its original destination; what none takes
// passes through, and a connection to 15001 itself goes nowhere.
func virtualOutbound() *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:             VirtualOutbound,
		Address:          socketAddress("0.0.0.0", virtualOutboundPort),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		UseOriginalDst:   wrapperspb.Bool(true),
		// One connection per wakeup: the accept queue is spread over
		// Envoy's workers rather than drained by one.
		MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
		FilterChains: []*listenerv3.FilterChain{
			{
				Name:             VirtualOutbound + "-blackhole",
				FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(virtualOutboundPort)},
				Filters:          []*listenerv3.Filter{tcpProxy(BlackHoleCluster)},
			},
			{Name: VirtualOutbound + "-catchall-tcp", Filters: []*listenerv3.Filter{tcpProxy(PassthroughCluster)}},
		},
	}
}

// virtualInbound takes the connections redirected to 15006: per target
// port of the workload's services, chains for the port's mutual TLS mode
// and protocol that end at inbound|port||; for every other port the same
// chains ending at the original destination.
func (m *Mesh) virtualInbound(p Proxy) *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:                                 VirtualInbound,
		Address:                              socketAddress("0.0.0.0", virtualInboundPort),
		TrafficDirection:                     corev3.TrafficDirection_INBOUND,
		ListenerFiltersTimeout:               durationpb.New(0),
		ContinueOnListenerFiltersTimeout:     true,
		MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
	}
	l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
		Name:             VirtualInbound + "-blackhole",
		FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(virtualInboundPort)},
		Filters:          []*listenerv3.Filter{metadataExchange(), tcpProxy(BlackHoleCluster)},
	})
	rbac := inboundFilters{network: m.networkRBAC(p), http: m.httpRBAC(p), trustDomain: m.TrustDomain}
	// The passthrough chains, for ports no service names, by the
	// workload's mode.
	mode := m.MTLSMode(p.Namespace, p.Labels, 0)
	l.FilterChains = append(l.FilterChains, inboundChains(VirtualInbound, 0, 0, "", InboundPassthroughCluster, ":0/*", mode, rbac, VirtualInbound+"-catchall-http")...)
	for _, in := range m.inboundPorts(p) {
		name := listenerName("0.0.0.0", in.target)
		cluster := ClusterName(Inbound, in.target, "", "")
		l.FilterChains = append(l.FilterChains, inboundChains(name, in.target, in.port, in.protocol, cluster, in.svc.GetHostname()+":"+u32(in.port)+"/*", m.MTLSMode(p.Namespace, p.Labels, in.target), rbac, name)...)
	}
	l.ListenerFilters = append([]*listenerv3.ListenerFilter{
		{Name: "envoy.filters.listener.original_dst", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&originaldstv3.OriginalDst{})}},
	}, inspectors(l.FilterChains)...)
	return l
}

// inspectors are the TLS and HTTP inspectors the inbound chains need, as
// istiod derives them: a port needs the TLS one when a chain of it matches
// TLS, the HTTP one when a chain matches plaintext HTTP's ALPN; an
// inspector is left out when no port needs it, and disabled on the ports
// that do not (or enabled on those that do, when the catch-all does not).
func inspectors(chains []*listenerv3.FilterChain) []*listenerv3.ListenerFilter {
	type need struct{ tls, http bool }
	byPort := map[uint32]need{}
	for _, fc := range chains {
		port := fc.GetFilterChainMatch().GetDestinationPort().GetValue()
		n := byPort[port]
		n.tls = n.tls || fc.GetFilterChainMatch().GetTransportProtocol() == "tls"
		n.http = n.http || slices.ContainsFunc(fc.GetFilterChainMatch().GetApplicationProtocols(), func(a string) bool { return a == "http/1.1" || a == "h2c" })
		byPort[port] = n
	}
	ports := slices.Sorted(maps.Keys(byPort))
	var out []*listenerv3.ListenerFilter
	if slices.ContainsFunc(ports, func(p uint32) bool { return byPort[p].tls }) {
		f := tlsInspector()
		var off, on []uint32
		for _, p := range ports {
			switch {
			case p == 0:
			case byPort[p].tls:
				on = append(on, p)
			default:
				off = append(off, p)
			}
		}
		switch {
		case byPort[0].tls && len(off) > 0:
			f.FilterDisabled = portsPredicate(off)
		case !byPort[0].tls && len(on) > 0:
			f.FilterDisabled = &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_NotMatch{NotMatch: portsPredicate(on)}}
		}
		out = append(out, f)
	}
	if slices.ContainsFunc(ports, func(p uint32) bool { return byPort[p].http }) {
		f := httpInspector()
		var off []uint32
		for _, p := range ports {
			if !byPort[p].http {
				off = append(off, p)
			}
		}
		if len(off) > 0 {
			f.FilterDisabled = portsPredicate(off)
		}
		out = append(out, f)
	}
	return out
}

// portsPredicate matches connections to any of ports.
func portsPredicate(ports []uint32) *listenerv3.ListenerFilterChainMatchPredicate {
	ports = slices.Compact(slices.Sorted(slices.Values(ports)))
	var rules []*listenerv3.ListenerFilterChainMatchPredicate
	for _, p := range ports {
		rules = append(rules, &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_DestinationPortRange{
			DestinationPortRange: &typev3.Int32Range{Start: int32(p), End: int32(p) + 1},
		}})
	}
	if len(rules) == 1 {
		return rules[0]
	}
	return &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_OrMatch{
		OrMatch: &listenerv3.ListenerFilterChainMatchPredicate_MatchSet{Rules: rules},
	}}
}

// inboundChains are the chains of one destination port (0: any): by
// mode, mutual TLS chains (HTTP, TCP) and plaintext ones, for the
// protocol (HTTP, TCP, or both when it is detected).
// inboundFilters are what every inbound chain enforces.
type inboundFilters struct {
	network     []*listenerv3.Filter
	http        []*hcmv3.HttpFilter
	trustDomain string
}

func inboundChains(name string, port, servicePort uint32, protocol, cluster, operation string, mode securityapi.PeerAuthentication_MutualTLS_Mode, rbac inboundFilters, httpName string) []*listenerv3.FilterChain {
	var out []*listenerv3.FilterChain
	for _, o := range inboundMatches(kindOf(protocol), port == 0, mode) {
		m := &listenerv3.FilterChainMatch{TransportProtocol: o.transport, ApplicationProtocols: o.alpn}
		if port != 0 {
			m.DestinationPort = wrapperspb.UInt32(port)
		}
		fc := &listenerv3.FilterChain{FilterChainMatch: m}
		if o.http {
			fc.Name = httpName
			fc.Filters = []*listenerv3.Filter{metadataExchange(), inboundHCM(port, servicePort, cluster, protocol, operation, rbac.http)}
		} else {
			fc.Name = name
			fc.Filters = append(append([]*listenerv3.Filter{metadataExchange()}, rbac.network...), tcpProxy(cluster))
		}
		if o.mtls {
			fc.TransportSocket = inboundTLS(o.http, rbac.trustDomain)
		}
		out = append(out, fc)
	}
	return out
}

// inboundMatch is one inbound chain's match: transport and ALPN, whether
// it carries HTTP, and whether it terminates Istio mutual TLS.
type inboundMatch struct {
	transport  string
	alpn       []string
	http, mtls bool
}

// inboundMatches are the chains of a port of a kind (any: the catch-all,
// whose protocol is detected) under a PeerAuthentication mode, in istiod's
// order. STRICT takes mutual TLS only, telling HTTP apart by its ALPN where
// the protocol is detected; DISABLE plaintext only; PERMISSIVE both, and
// on detected and TCP ports TLS the application terminates itself.
func inboundMatches(kind portKind, catchAll bool, mode securityapi.PeerAuthentication_MutualTLS_Mode) []inboundMatch {
	if catchAll {
		kind = kindSniffed
	}
	switch mode {
	case securityapi.PeerAuthentication_MutualTLS_STRICT:
		switch kind {
		case kindHTTP:
			return []inboundMatch{{transport: "tls", http: true, mtls: true}}
		case kindTCP:
			return []inboundMatch{{transport: "tls", mtls: true}}
		}
		return []inboundMatch{{transport: "tls", alpn: mtlsHTTPProtocols, http: true, mtls: true}, {transport: "tls", mtls: true}}
	case securityapi.PeerAuthentication_MutualTLS_DISABLE:
		switch kind {
		case kindHTTP:
			return []inboundMatch{{transport: "raw_buffer", http: true}}
		case kindTCP:
			return []inboundMatch{{transport: "raw_buffer"}}
		}
		return []inboundMatch{{transport: "raw_buffer", alpn: plainHTTPProtocols, http: true}, {transport: "raw_buffer"}}
	}
	switch kind {
	case kindHTTP:
		return []inboundMatch{{transport: "tls", alpn: mtlsAnyProtocols, http: true, mtls: true}, {transport: "raw_buffer", http: true}}
	case kindTCP:
		return []inboundMatch{{transport: "tls", alpn: mtlsAnyProtocols, mtls: true}, {transport: "tls"}, {transport: "raw_buffer"}}
	}
	return []inboundMatch{
		{transport: "tls", alpn: mtlsHTTPProtocols, http: true, mtls: true},
		{transport: "raw_buffer", alpn: plainHTTPProtocols, http: true},
		{transport: "tls", alpn: mtlsTCPProtocols, mtls: true},
		{transport: "raw_buffer"},
		// TLS the application terminates itself passes through.
		{transport: "tls"},
	}
}

// inboundTLS terminates Istio mutual TLS: the sidecar's certificate and
// roots from its agent, a client certificate required.
func inboundTLS(http bool, trustDomain string) *corev3.TransportSocket {
	alpn := []string{"h2", "http/1.1"}
	if !http {
		alpn = []string{"istio-peer-exchange", "h2", "http/1.1"}
	}
	ctx := sdsTLSContext(nil, alpn)
	// Any identity of the trust domain; authorization decides the rest.
	//lint:ignore SA1019 Istio's sidecars check identities in this field
	ctx.GetCombinedValidationContext().GetDefaultValidationContext().MatchSubjectAltNames = []*matcherv3.StringMatcher{{
		MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + trustDomain + "/"},
	}}
	ctx.TlsParams.CipherSuites = []string{
		"ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
		"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
		"AES256-GCM-SHA384", "AES128-GCM-SHA256",
	}
	return tlsSocket(&tlsv3.DownstreamTlsContext{CommonTlsContext: ctx, RequireClientCertificate: wrapperspb.Bool(true)})
}

// inboundHCM routes every request to cluster, through the HTTP RBAC
// filters; requests the application reset before it read them are tried
// again (not gRPC's, whose streams may have been half sent). operation
// names the route in traces.
func inboundHCM(port, servicePort uint32, cluster, protocol, operation string, rbac []*hcmv3.HttpFilter) *listenerv3.Filter {
	action := &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		Timeout:          noTimeout,
		MaxStreamDuration: &routev3.RouteAction_MaxStreamDuration{
			MaxStreamDuration: noTimeout, GrpcTimeoutHeaderMax: noTimeout,
		},
	}
	if protocol != "GRPC" && protocol != "GRPC-Web" {
		action.RetryPolicy = &routev3.RetryPolicy{RetryOn: "reset-before-request", NumRetries: wrapperspb.UInt32(2)}
	}
	filters := slices.Clone(rbac)
	if protocol == "GRPC-Web" {
		filters = append(filters, grpcWebFilter())
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "inbound_0.0.0.0_" + u32(port),
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name:             cluster,
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound|http|" + u32(servicePort),
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Name:      "default",
					Match:     &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Decorator: &routev3.Decorator{Operation: operation},
					Action:    &routev3.Route_Route{Route: action},
				}},
			}},
		}},
		HttpFilters:                  append(filters, faultFilter(), corsFilter(), routerFilter()),
		UseRemoteAddress:             wrapperspb.Bool(false),
		NormalizePath:                wrapperspb.Bool(true),
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_KEEP_UNCHANGED,
		StreamIdleTimeout:            durationpb.New(0),
		ServerName:                   "istio-envoy",
		Proxy_100Continue:            true,
		ForwardClientCertDetails:     hcmv3.HttpConnectionManager_APPEND_FORWARD,
		SetCurrentClientCertDetails:  &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Uri: true, Dns: true},
		UpgradeConfigs:               []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}},
	}
	if http2(protocol) {
		// An HTTP/2 port takes HTTP/2 without negotiating it.
		hcm.Http2ProtocolOptions = &corev3.Http2ProtocolOptions{}
	}
	return hcmFilter(hcm)
}

// sidecarDomains are the names an application may call a service by on a
// sidecar: as a proxyless client's, without the ":port" forms (a
// sidecar's route configurations ignore ports in host matching).
func (m *Mesh) sidecarDomains(p Proxy, s *Service, port uint32) []string {
	var out []string
	for _, d := range m.grpcDomains(p, s.Service, port) {
		if _, _, err := net.SplitHostPort(d); err == nil && !strings.HasSuffix(d, "]") {
			continue
		}
		if _, err := netip.ParseAddr(strings.Trim(d, "[]")); err == nil && s.Info.AutoAllocated {
			continue // not captured by address (sidecarAddresses)
		}
		out = append(out, d)
	}
	return out
}
