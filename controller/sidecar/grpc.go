package sidecar

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Named is a generated resource with the name it answers.
type Named struct {
	Name     string
	Resource proto.Message
}

// GRPCListeners answers a proxyless client's listener names: "host:port"
// (or "host", for every port) for the services it calls, each answered
// under exactly the name asked for, and ServerListenerPrefix+"ip:port" for
// its own serving ports. Names that match nothing are left out.
func (m *Mesh) GRPCListeners(p Proxy, names []string) []Named {
	var out []Named
	for _, name := range slices.Sorted(slices.Values(names)) {
		if addr, ok := strings.CutPrefix(name, ServerListenerPrefix); ok {
			if l := m.grpcServerListener(p, name, addr); l != nil {
				out = append(out, Named{name, l})
			}
			continue
		}
		host, port, svc, ok := m.grpcClientTarget(p, name)
		if !ok {
			continue
		}
		for _, sp := range svc.GetPorts() {
			if port != 0 && sp.GetServicePort() != port {
				continue
			}
			ln := net.JoinHostPort(host, u32(sp.GetServicePort()))
			out = append(out, Named{ln, grpcClientListener(ln, svc, sp.GetServicePort())})
		}
	}
	return out
}

// grpcClientTarget is the service a client listener name ("host:port"
// or "host") calls, with the name's host and port (0: every port); false
// when the proxy sees no such service, or it lacks the port.
func (m *Mesh) grpcClientTarget(p Proxy, name string) (string, uint32, *Service, bool) {
	host, port, err := hostPort(name)
	if err != nil {
		return "", 0, nil, false
	}
	svc := m.Service(p, fqdn(host, p.Namespace, m.DomainSuffix))
	if svc == nil || len(svc.GetPorts()) == 0 || port != 0 && !hasPort(svc.Service, port) {
		return "", 0, nil, false
	}
	return host, port, svc, true
}

// grpcClientListener is an API listener whose routes come over RDS.
func grpcClientListener(name string, svc *Service, port uint32) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		HttpFilters: grpcClientFilters(),
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: ClusterName(Outbound, port, "", svc.GetHostname()),
		}},
	}
	return &listenerv3.Listener{
		Name:        name,
		Address:     socketAddress(vip(svc.Service), port),
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)},
	}
}

func grpcClientFilters() []*hcmv3.HttpFilter {
	return []*hcmv3.HttpFilter{
		{Name: "envoy.filters.http.fault", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&faultv3.HTTPFault{})}},
		routerFilter(),
	}
}

func routerFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}
}

// grpcServerListener answers "ip:port" when the proxy serves a service on
// that target port; its one chain is plaintext or mutual TLS as the
// port's PeerAuthentication mode says (gRPC has no permissive mode: with
// auto mTLS labels it is mutual TLS, without, plaintext), and enforces
// the AuthorizationPolicies that select the proxy.
func (m *Mesh) grpcServerListener(p Proxy, name, addr string) *listenerv3.Listener {
	host, port, ok := m.grpcServerAddr(p, addr)
	if !ok {
		return nil
	}
	filters := m.grpcRBACFilters(p)
	var chain *listenerv3.FilterChain
	if m.grpcServerMTLS(p, port) {
		chain = grpcInboundChain("mtls", &tlsv3.DownstreamTlsContext{
			CommonTlsContext:         providerTLSContext(nil),
			RequireClientCertificate: wrapperspb.Bool(true),
		}, filters)
	} else {
		chain = grpcInboundChain("plaintext", nil, filters)
	}
	return &listenerv3.Listener{
		Name:         name,
		Address:      socketAddress(host, port),
		FilterChains: []*listenerv3.FilterChain{chain},
	}
}

// grpcServerAddr is a server listener's "ip:port", when the ip is the
// proxy's (or unspecified) and one of its workloads serves some service
// on that target port.
func (m *Mesh) grpcServerAddr(p Proxy, addr string) (string, uint32, bool) {
	host, port, err := hostPort(addr)
	if err != nil || port == 0 {
		return "", 0, false
	}
	// The address as a listener's own address writes it (an IPv6 address
	// has many spellings), and the proxy's or unspecified.
	if ip, err := netip.ParseAddr(host); err != nil || ip.String() != host || !(ip.IsUnspecified() || slices.Contains(p.IPs, ip)) {
		return "", 0, false
	}
	if !m.servesTargetPort(p, port) {
		return "", 0, false
	}
	return host, port, true
}

// servesTargetPort reports whether one of the proxy's workloads is an
// endpoint of some service on target port port.
func (m *Mesh) servesTargetPort(p Proxy, port uint32) bool {
	for _, ref := range m.ownEndpoints(p) {
		for _, tp := range ref.ep.Ports {
			if tp == port {
				return true
			}
		}
	}
	return false
}

// grpcServerMTLS: the server port takes mutual TLS when its mode is STRICT,
// or PERMISSIVE on a workload labelled for auto mTLS.
func (m *Mesh) grpcServerMTLS(p Proxy, port uint32) bool {
	switch m.MTLSMode(p.Namespace, p.Labels, port) {
	case securityapi.PeerAuthentication_MutualTLS_STRICT:
		return true
	case securityapi.PeerAuthentication_MutualTLS_PERMISSIVE:
		return p.Labels["security.istio.io/tlsMode"] == "istio"
	}
	return false
}

// grpcInboundChain routes every request to the server itself, through
// the RBAC filters rbac and then the router.
func grpcInboundChain(suffix string, tls *tlsv3.DownstreamTlsContext, rbac []*hcmv3.HttpFilter) *listenerv3.FilterChain {
	hcm := &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*routev3.VirtualHost{{
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
				}},
			}},
		}},
		HttpFilters: append(slices.Clone(rbac), routerFilter()),
	}
	fc := &listenerv3.FilterChain{
		Name:    "inbound-" + suffix,
		Filters: []*listenerv3.Filter{{Name: "inbound-hcm" + suffix, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)}}},
	}
	if tls != nil {
		fc.TransportSocket = tlsSocket(tls)
	}
	return fc
}

// GRPCRoutes answers route names "outbound|port||hostname": the one
// virtual host of that service and port. A port that carries no HTTP (TCP
// or TLS), or a service or port that does not exist, gets a configuration
// without virtual hosts, so a client fails its calls instead of waiting.
func (m *Mesh) GRPCRoutes(p Proxy, names []string) []Named {
	var out []Named
	for _, name := range slices.Sorted(slices.Values(names)) {
		k, err := ParseClusterName(name)
		if err != nil || k.Direction != Outbound || k.Subset != "" {
			continue
		}
		rc := &routev3.RouteConfiguration{Name: name}
		out = append(out, Named{name, rc})
		svc, ok := m.grpcRouteService(p, name)
		if !ok {
			continue
		}
		t := routeTarget{svc: svc, port: k.Port}
		rc.VirtualHosts = []*routev3.VirtualHost{{
			Name:                       k.Hostname + ":" + u32(k.Port),
			Domains:                    m.grpcDomains(p, svc.Service, k.Port),
			Routes:                     m.routes(p, t),
			IncludeRequestAttemptCount: true,
		}}
	}
	return out
}

// grpcRouteService is the service whose routes a route name of
// GRPCRoutes' form asks for; false when the name gets no virtual hosts
// (or nothing at all).
func (m *Mesh) grpcRouteService(p Proxy, name string) (*Service, bool) {
	k, err := ParseClusterName(name)
	if err != nil || k.Direction != Outbound || k.Subset != "" {
		return nil, false
	}
	svc := m.Service(p, k.Hostname)
	if svc == nil || !routesHTTP(svc.Service, k.Port) {
		return nil, false
	}
	return svc, true
}

// routesHTTP reports whether the service has port and it may carry HTTP:
// its protocol is HTTP, HTTP/2 or gRPC, or unknown (sniffed).
func routesHTTP(s *workloadapi.Service, port uint32) bool {
	for _, sp := range s.GetPorts() {
		if sp.GetServicePort() == port {
			switch sp.GetAppProtocol() {
			case workloadapi.AppProtocol_TCP, workloadapi.AppProtocol_TLS:
				return false
			}
			return true
		}
	}
	return false
}

// grpcDomains are the names a client may call the service by, each also
// with ":port" (a proxyless client matches the target's authority, port
// included): the hostname, its absolute form (with a trailing dot), for a
// Kubernetes Service the short forms (the bare name only from the
// service's own namespace), each also as "*.name" for a headless one, then
// its VIPs.
func (m *Mesh) grpcDomains(p Proxy, s *workloadapi.Service, port uint32) []string {
	host := s.GetHostname()
	names := []string{host, host + "."}
	suffix := "." + s.GetNamespace() + ".svc." + m.DomainSuffix
	short, kube := strings.CutSuffix(host, suffix)
	kube = kube && !strings.Contains(short, ".")
	if kube {
		ns := short + "." + s.GetNamespace()
		if s.GetNamespace() == p.Namespace {
			names = append(names, short, ns+".svc", ns)
		} else {
			names = append(names, ns, ns+".svc")
		}
	}
	var out []string
	for _, n := range names {
		out = append(out, n, net.JoinHostPort(n, u32(port)))
	}
	if kube && len(s.GetAddresses()) == 0 {
		// A headless Service: its pods' own names too.
		for _, d := range slices.Clone(out) {
			out = append(out, "*."+d)
		}
	}
	for _, a := range s.GetAddresses() {
		if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
			// An IPv6 address in brackets, as in a Host header.
			hp := net.JoinHostPort(ip.Unmap().String(), u32(port))
			out = append(out, hp[:strings.LastIndex(hp, ":")], hp)
		}
	}
	return out
}

// GRPCClusters answers cluster names "outbound|port|subset|hostname": EDS
// clusters with the DestinationRule's load balancer, request limit and
// TLS mode applied (the subset's policy over the rule's).
func (m *Mesh) GRPCClusters(p Proxy, names []string) []Named {
	var out []Named
	for _, name := range slices.Sorted(slices.Values(names)) {
		if c, ok := m.clusterTarget(p, name); ok {
			out = append(out, Named{name, m.grpcCluster(name, c.svc, c.policy)})
		}
	}
	return out
}

func (m *Mesh) grpcCluster(name string, svc *Service, policy *networkingapi.TrafficPolicy) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		AltStatName:          name + ";",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: name, EdsConfig: adsSource()},
	}
	if lb := policy.GetLoadBalancer(); lb != nil {
		switch {
		case lb.GetConsistentHash() != nil:
			applyConsistentHash(c, lb.GetConsistentHash())
			if c.LbPolicy == clusterv3.Cluster_MAGLEV {
				// grpc-go has no Maglev and would refuse the cluster; a
				// ring (of its default size) hashes the same requests
				// onto the same endpoints as long as they do not change.
				c.LbPolicy = clusterv3.Cluster_RING_HASH
				c.LbConfig = nil
			}
		case lb.GetSimple() == networkingapi.LoadBalancerSettings_LEAST_REQUEST:
			c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		}
	}
	if n := policy.GetConnectionPool().GetHttp().GetHttp2MaxRequests(); n > 0 {
		c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{MaxRequests: wrapperspb.UInt32(uint32(n))}}}
	}
	if policy.GetTls().GetMode() == networkingapi.ClientTLSSettings_ISTIO_MUTUAL {
		c.TransportSocket = tlsSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: providerTLSContext(m.serviceAccounts(svc))})
	}
	return c
}

// serviceAccounts are the identities of a service's endpoints, which a
// client checks the server's certificate against.
func (m *Mesh) serviceAccounts(svc *Service) []string {
	m.readServices() // the services' fingerprint covers their identities
	var out []string
	for _, ep := range svc.Endpoints {
		if ep.GetServiceAccount() == "" {
			continue
		}
		td := ep.GetTrustDomain()
		if td == "" {
			td = m.TrustDomain
		}
		id := "spiffe://" + td + "/ns/" + ep.GetNamespace() + "/sa/" + ep.GetServiceAccount()
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	out = append(out, svc.GetSubjectAltNames()...)
	return out
}

// providerTLSContext names the client's certificate provider instance
// "default" for its certificate ("default") and roots ("ROOTCA"), in the
// current fields and in the deprecated ones older clients read.
func providerTLSContext(sans []string) *tlsv3.CommonTlsContext {
	var match []*matcherv3.StringMatcher
	for _, s := range sans {
		match = append(match, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}})
	}
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "default"},
		//lint:ignore SA1019 older gRPC clients read only this field
		TlsCertificateCertificateProviderInstance: &tlsv3.CommonTlsContext_CertificateProviderInstance{
			InstanceName: "default", CertificateName: "default",
		},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{
				//lint:ignore SA1019 gRPC clients check server names from this field
				MatchSubjectAltNames:          match,
				CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "ROOTCA"},
			},
			//lint:ignore SA1019 older gRPC clients read only this field
			ValidationContextCertificateProviderInstance: &tlsv3.CommonTlsContext_CertificateProviderInstance{
				InstanceName: "default", CertificateName: "ROOTCA",
			},
		}},
	}
}

func tlsSocket(m proto.Message) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(m)}}
}

func hasPort(s *workloadapi.Service, port uint32) bool {
	return slices.ContainsFunc(s.GetPorts(), func(p *workloadapi.Port) bool { return p.GetServicePort() == port })
}

func vip(s *workloadapi.Service) string {
	for _, a := range s.GetAddresses() {
		if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
			return ip.Unmap().String()
		}
	}
	return "0.0.0.0"
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

// mustAny packs a message the generators built; only a programming error
// can make it fail.
//
// The bytes are deterministic (map entries sorted), so that a resource
// generated again from the same mesh has the same version and is not
// pushed again.
func mustAny(m proto.Message) *anypb.Any {
	a := &anypb.Any{}
	err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true})
	if err != nil {
		panic(fmt.Sprintf("sidecar: pack %T: %v", m, err))
	}
	return a
}
