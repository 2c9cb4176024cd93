package sidecar

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	caresv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/network/dns_resolver/cares/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Names of the clusters every sidecar gets (sidecar wire contract §2.1).
const (
	BlackHoleCluster          = "BlackHoleCluster"
	PassthroughCluster        = "PassthroughCluster"
	InboundPassthroughCluster = "InboundPassthroughCluster"
)

// inboundBindAddress is the source address a sidecar uses towards its own
// application, so that the redirection rules let the connection through.
const inboundBindAddress = "127.0.0.6"

// portKind is how a sidecar carries a port's traffic.
type portKind int

const (
	kindSniffed portKind = iota // protocol detected per connection
	kindHTTP                    // HTTP/1.1, HTTP/2, gRPC, gRPC-Web
	kindTCP                     // opaque bytes (TCP, TLS, and protocols without a filter)
	kindUDP                     // not carried
)

// portProtocol is the Istio protocol name of a service port, from the
// service's description, else from the workload table's app protocol.
func portProtocol(s *Service, port uint32) string {
	if s.Info.Protocols != nil {
		return s.Info.Protocols[port]
	}
	for _, sp := range s.GetPorts() {
		if sp.GetServicePort() == port {
			switch sp.GetAppProtocol() {
			case workloadapi.AppProtocol_HTTP11:
				return "HTTP"
			case workloadapi.AppProtocol_HTTP2:
				return "HTTP2"
			case workloadapi.AppProtocol_GRPC:
				return "GRPC"
			case workloadapi.AppProtocol_TCP:
				return "TCP"
			case workloadapi.AppProtocol_TLS:
				return "TLS"
			}
		}
	}
	return ""
}

func kindOf(protocol string) portKind {
	switch protocol {
	case "":
		return kindSniffed
	case "HTTP", "HTTP2", "GRPC", "GRPC-Web", "HTTP_PROXY":
		return kindHTTP
	case "UDP":
		return kindUDP
	}
	return kindTCP
}

// http2 reports whether a protocol is always HTTP/2 upstream.
func http2(protocol string) bool {
	return protocol == "HTTP2" || protocol == "GRPC" || protocol == "GRPC-Web"
}

// visibleServices are the services proxy p may send to, by hostname:
// those exported to its namespace that its Sidecar resource's egress
// hosts import.
func (m *Mesh) visibleServices(p Proxy) []*Service {
	scope := m.SidecarScope(p)
	m.readServices()
	var out []*Service
	for _, h := range slices.Sorted(maps.Keys(m.services)) {
		if s := m.Service(p, h); s != nil && egressAllows(scope, h, s.GetNamespace()) {
			out = append(out, s)
		}
	}
	return out
}

// sortedPorts are a service's ports in order.
func sortedPorts(s *Service) []uint32 {
	var out []uint32
	for _, sp := range s.GetPorts() {
		out = append(out, sp.GetServicePort())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SidecarClusters are every cluster a sidecar gets (sidecar wire contract
// §2): its outbound clusters and its inbound ones.
func (m *Mesh) SidecarClusters(p Proxy) []Named {
	return append(m.sidecarOutboundClusters(p), m.sidecarInboundClusters(p)...)
}

// sidecarOutboundClusters are the clusters of every sidecar of p's
// namespace and Sidecar scope: an outbound cluster per port of each
// service it may see, and per port and subset of the service's
// DestinationRule; and the black hole and passthrough clusters.
func (m *Mesh) sidecarOutboundClusters(p Proxy) []Named {
	var out []Named
	for _, svc := range m.visibleServices(p) {
		dr := m.DestinationRule(p, svc.GetHostname(), svc.GetNamespace())
		if m.refused(dr) {
			continue // never a cluster without what its rule asked for
		}
		for _, port := range sortedPorts(svc) {
			protocol := portProtocol(svc, port)
			if kindOf(protocol) == kindUDP {
				continue
			}
			subsets := []string{""}
			if dr != nil {
				for _, ss := range dr.Spec.GetSubsets() {
					subsets = append(subsets, ss.GetName())
				}
			}
			for _, ss := range subsets {
				policy, ok := clusterPolicy(dr, port, ss)
				if !ok {
					continue
				}
				name := ClusterName(Outbound, port, ss, svc.GetHostname())
				out = append(out, Named{name, m.outboundCluster(p, name, svc, port, ss, protocol, policy, dr)})
			}
		}
	}
	out = append(out,
		Named{BlackHoleCluster, &clusterv3.Cluster{
			Name: BlackHoleCluster, AltStatName: BlackHoleCluster + ";",
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(defaultConnectTimeout),
		}},
		Named{PassthroughCluster, passthroughCluster(PassthroughCluster, false)},
		Named{InboundPassthroughCluster, passthroughCluster(InboundPassthroughCluster, true)},
	)
	if p.HBONE {
		out = append(out, Named{ConnectOriginate, connectOriginateCluster(m.TrustDomain)})
	}
	return out
}

// sidecarInboundClusters are the proxy's own: an inbound cluster per
// target port its workload serves.
func (m *Mesh) sidecarInboundClusters(p Proxy) []Named {
	var out []Named
	for _, in := range m.inboundPorts(p) {
		name := ClusterName(Inbound, in.target, "", "")
		dr := m.DestinationRule(p, in.svc.GetHostname(), in.svc.GetNamespace())
		if m.refused(dr) {
			// The workload's own port, to its own application: served
			// with the defaults rather than not at all.
			dr = nil
		}
		policy, _ := clusterPolicy(dr, in.port, "")
		out = append(out, Named{name, m.inboundCluster(p, name, in, policy, dr)})
	}
	return out
}

// inboundPort is a target port the proxy's own workload serves, with the
// first service (by hostname) and service port that send to it.
type inboundPort struct {
	target, port uint32
	svc          *Service
	protocol     string
}

// inboundPorts are the target ports of the services the proxy's
// workloads serve, in order.
func (m *Mesh) inboundPorts(p Proxy) []inboundPort {
	byTarget := map[uint32]inboundPort{}
	for _, ref := range m.ownEndpoints(p) {
		s, ep := ref.svc, ref.ep
		for _, port := range slices.Sorted(maps.Keys(ep.Ports)) {
			target := ep.Ports[port]
			protocol := portProtocol(s, port)
			if _, seen := byTarget[target]; seen || kindOf(protocol) == kindUDP {
				continue
			}
			byTarget[target] = inboundPort{target: target, port: port, svc: s, protocol: protocol}
		}
	}
	var out []inboundPort
	for _, t := range slices.Sorted(maps.Keys(byTarget)) {
		out = append(out, byTarget[t])
	}
	return out
}

// defaultConnectTimeout is a cluster's connect timeout when no
// DestinationRule sets one.
const defaultConnectTimeout = 10 * time.Second

func (m *Mesh) outboundCluster(p Proxy, name string, svc *Service, port uint32, subsetName, protocol string, policy *networkingapi.TrafficPolicy, dr *networkingv1.DestinationRule) *clusterv3.Cluster {
	b := newClusterBuild(name)
	c := b.c
	c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
	// A subset's own PASSTHROUGH load balancer makes its cluster an
	// original destination from the start, as istiod builds it; the
	// rule's makes it one when the load balancer is applied.
	passthrough := subset(dr, subsetName).GetTrafficPolicy().GetLoadBalancer().GetSimple() == networkingapi.LoadBalancerSettings_PASSTHROUGH
	original := svc.Info.Resolution == None || m.isHeadless(svc) || passthrough
	switch {
	case original:
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
	case svc.Info.Resolution == DNS || svc.Info.Resolution == DNSRoundRobin:
		typ := clusterv3.Cluster_STRICT_DNS
		if svc.Info.Resolution == DNSRoundRobin {
			typ = clusterv3.Cluster_LOGICAL_DNS
		}
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: typ}
		c.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
		//lint:ignore SA1019 the fields Istio's sidecars are configured by
		c.RespectDnsTtl = true
		//lint:ignore SA1019 as above
		c.DnsRefreshRate = durationpb.New(time.Minute)
		c.LoadAssignment = m.dnsAssignment(name, svc, port)
		// Periodic lookups spread over 100 ms; c-ares sends at most 100
		// queries on one UDP socket before opening another.
		//lint:ignore SA1019 the field Istio's sidecars are configured by
		c.DnsJitter = durationpb.New(100 * time.Millisecond)
		c.TypedDnsResolverConfig = &corev3.TypedExtensionConfig{Name: "envoy.network.dns_resolver.cares", TypedConfig: mustAny(&caresv3.CaresDnsResolverConfig{
			UdpMaxQueries: wrapperspb.UInt32(100),
		})}
	default:
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
	}
	b.setUpstreamProtocol(protocol)
	pool := policy.GetConnectionPool()
	b.applyH2Upgrade(pool)
	b.applyConnectionPool(pool, policy.GetRetryBudget())
	aware := locationAware(svc)
	applyOutlierDetection(c, policy.GetOutlierDetection(), aware)
	applyLoadBalancer(c, policy.GetLoadBalancer(), aware)
	original = c.GetType() == clusterv3.Cluster_ORIGINAL_DST
	if c.GetType() == clusterv3.Cluster_EDS {
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{ServiceName: name, EdsConfig: adsSourceNoWait()}
	}
	c.Filters = []*clusterv3.Filter{{Name: "istio.metadata_exchange", TypedConfig: metadataExchangeConfig()}}
	c.Metadata = clusterMetadata(svc, m.DomainSuffix, dr, subsetName)
	if subsetName == "" {
		// Telemetry's peer metadata exchange is skipped for a service
		// outside the mesh (if configured so) and always for one whose
		// endpoints all take HBONE (their node proxies report).
		// One key or the other, as istiod writes it.
		istio := c.Metadata.FilterMetadata["istio"]
		switch {
		case m.allTunnel(svc, port):
			istio.Fields["disable_mx"] = structpb.NewBoolValue(true)
		case svc.Info.External:
			istio.Fields["external"] = structpb.NewBoolValue(true)
		}
	}

	// Mutual TLS: as the rule says, else automatically towards the
	// endpoints labelled for it (not for a service outside the mesh); to
	// an original destination, when every endpoint is labelled for it and
	// the namespace does not disable it.
	alpn := []string{"istio-peer-exchange", "istio"}
	if http2(protocol) || b.http.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
		alpn = append(alpn, "h2")
	}
	tlsContext := func() *tlsv3.UpstreamTlsContext {
		sans := m.serviceAccounts(svc)
		if s := policy.GetTls().GetSubjectAltNames(); len(s) > 0 {
			sans = s
		}
		return &tlsv3.UpstreamTlsContext{
			CommonTlsContext: sdsTLSContext(sans, alpn),
			Sni:              cmp.Or(policy.GetTls().GetSni(), sniName(port, subsetName, svc.GetHostname())),
		}
	}
	var matches []*clusterv3.Cluster_TransportSocketMatch
	switch tls := policy.GetTls(); {
	case tls.GetMode() == networkingapi.ClientTLSSettings_ISTIO_MUTUAL:
		if p.HBONE {
			matches = append(matches, &clusterv3.Cluster_TransportSocketMatch{Name: "tlsMode-istio", TransportSocket: tlsSocket(tlsContext())})
		} else {
			c.TransportSocket = tlsSocket(tlsContext())
		}
	case tls.GetMode() == networkingapi.ClientTLSSettings_SIMPLE || tls.GetMode() == networkingapi.ClientTLSSettings_MUTUAL:
		ts := tlsSocket(originationTLS(tls, svc.GetHostname(), protocol))
		if !p.HBONE {
			c.TransportSocket = ts
			break
		}
		// The destination gets the TLS asked for, through the tunnel to an
		// ambient workload too.
		matches = append(matches, hboneMatchAround(ts), &clusterv3.Cluster_TransportSocketMatch{Name: "user", TransportSocket: ts})
	case tls == nil && !svc.Info.External && original:
		if m.allIstioTLS(svc, port) && m.MTLSMode(svc.GetNamespace(), nil, 0) != securityapi.PeerAuthentication_MutualTLS_DISABLE {
			c.TransportSocket = tlsSocket(tlsContext())
		} else if p.HBONE {
			matches = append(matches, &clusterv3.Cluster_TransportSocketMatch{Name: "tlsMode-disabled", Match: &structpb.Struct{}, TransportSocket: rawBufferSocket()})
		}
	case tls == nil && !svc.Info.External:
		matches = append(matches,
			&clusterv3.Cluster_TransportSocketMatch{Name: "tlsMode-istio", Match: tlsModeMatch(), TransportSocket: tlsSocket(tlsContext())},
			&clusterv3.Cluster_TransportSocketMatch{Name: "tlsMode-disabled", Match: &structpb.Struct{}, TransportSocket: rawBufferSocket()})
	case p.HBONE:
		matches = append(matches, &clusterv3.Cluster_TransportSocketMatch{Name: "tlsMode-disabled", Match: &structpb.Struct{}, TransportSocket: rawBufferSocket()})
	}
	if p.HBONE && c.TransportSocket == nil && (len(matches) == 0 || matches[0].GetName() != "hbone") {
		matches = append([]*clusterv3.Cluster_TransportSocketMatch{hboneMatch()}, matches...)
	}
	c.TransportSocketMatches = matches
	applyProxyProtocol(c, policy.GetProxyProtocol())
	return b.finish()
}

// originationTLS is the TLS a rule's SIMPLE or MUTUAL mode originates:
// the roots and client certificate as files the sidecar's agent serves
// over SDS ("file-root:<path>", "file-cert:<cert>~<key>"), the system
// roots when the rule names none, or a credential secret
// ("kubernetes://<name>") over ADS. Canopy does not serve credential
// secrets yet, so such a cluster stays warming and carries no traffic:
// never plaintext where TLS was asked for.
func originationTLS(tls *networkingapi.ClientTLSSettings, hostname, protocol string) *tlsv3.UpstreamTlsContext {
	var alpn []string
	if http2(protocol) {
		alpn = []string{"h2"}
	}
	ctx := &tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{
			TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
			TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
		},
		AlpnProtocols: alpn,
	}
	var sans []*matcherv3.StringMatcher
	for _, s := range tls.GetSubjectAltNames() {
		sans = append(sans, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}})
	}
	validation := &tlsv3.CertificateValidationContext{}
	if len(sans) > 0 {
		//lint:ignore SA1019 Istio's sidecars check identities in this field
		validation.MatchSubjectAltNames = sans
	}
	roots := "file-root:system"
	switch {
	case tls.GetCredentialName() != "":
		secret := &tlsv3.SdsSecretConfig{Name: "kubernetes://" + tls.GetCredentialName(), SdsConfig: adsSource()}
		ctx.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{secret}
		roots = "kubernetes://" + tls.GetCredentialName() + "-cacert"
		if tls.GetMode() == networkingapi.ClientTLSSettings_SIMPLE {
			ctx.TlsCertificateSdsSecretConfigs = nil
			roots = "kubernetes://" + tls.GetCredentialName()
		}
		ctx.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: validation, ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: roots, SdsConfig: adsSource()},
		}}
	default:
		if tls.GetCaCertificates() != "" {
			roots = "file-root:" + tls.GetCaCertificates()
		}
		if tls.GetMode() == networkingapi.ClientTLSSettings_MUTUAL {
			ctx.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sds("file-cert:" + tls.GetClientCertificate() + "~" + tls.GetPrivateKey())}
		}
		ctx.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: validation, ValidationContextSdsSecretConfig: sds(roots),
		}}
	}
	if tls.GetInsecureSkipVerify().GetValue() {
		ctx.ValidationContextType = nil
	}
	return &tlsv3.UpstreamTlsContext{CommonTlsContext: ctx, Sni: cmp.Or(tls.GetSni(), hostname)}
}

// allTunnel reports a service port whose endpoints (there are some) all
// take HBONE. It is a property of the service (indexTunnels), so that
// reading it does not make a cluster depend on every endpoint change.
func (m *Mesh) allTunnel(svc *Service, port uint32) bool {
	m.readServices()
	return slices.Contains(svc.tunnelPorts, port)
}

// allIstioTLS reports a service port whose endpoints (there are some) are
// all labelled for Istio mutual TLS (indexTunnels). Only clusters to an
// original destination ask, and they then depend on the service's
// endpoints, whose fingerprint covers the labels.
func (m *Mesh) allIstioTLS(svc *Service, port uint32) bool {
	m.readEndpoints(svc.GetHostname())
	return slices.Contains(svc.istioTLSPorts, port)
}

// indexTunnels finds each service's ports whose endpoints all take HBONE,
// and those whose endpoints are all labelled for Istio mutual TLS.
func (m *Mesh) indexTunnels() {
	for _, svcs := range m.services {
		for _, s := range svcs {
			s.tunnelPorts, s.istioTLSPorts = nil, nil
			for _, port := range sortedPorts(s) {
				n, all, allTLS := 0, true, true
				for _, ep := range s.Endpoints {
					// Every endpoint the registry holds, terminating
					// ones too, as istiod counts them; a ServiceEntry
					// selects only ready pods.
					unready := ep.GetStatus() != workloadapi.WorkloadStatus_HEALTHY && isPod(ep) && !m.isKubernetesService(s.Service)
					if _, ok := ep.Ports[port]; ok && !unready {
						n++
						all = all && ep.GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE
						allTLS = allTLS && tlsMode(ep) == "istio"
					}
				}
				if n > 0 && all {
					s.tunnelPorts = append(s.tunnelPorts, port)
				}
				if n > 0 && allTLS {
					s.istioTLSPorts = append(s.istioTLSPorts, port)
				}
			}
		}
	}
}

// isHeadless reports a Kubernetes Service without a cluster IP.
func (m *Mesh) isHeadless(svc *Service) bool {
	return m.isKubernetesService(svc.Service) && len(svc.GetAddresses()) == 0
}

func tlsModeMatch() *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}}
}

func rawBufferSocket() *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbufferv3.RawBuffer{})}}
}

// sniName is the SNI of Istio mutual TLS towards a cluster:
// "outbound_.<port>_.<subset>_.<hostname>".
func sniName(port uint32, subsetName, hostname string) string {
	return "outbound_." + u32(port) + "_." + subsetName + "_." + hostname
}

// clusterMetadata says which service (and rule, and subset) a cluster is
// for, as Istio's telemetry reads it.
func clusterMetadata(svc *Service, domain string, dr *networkingv1.DestinationRule, subsetName string) *corev3.Metadata {
	name := svc.GetHostname()
	if short, ok := strings.CutSuffix(name, "."+svc.GetNamespace()+".svc."+domain); ok {
		name = short
	}
	fields := map[string]any{
		"services": []any{map[string]any{"host": svc.GetHostname(), "name": name, "namespace": svc.GetNamespace()}},
	}
	if dr != nil {
		fields["config"] = "/apis/networking.istio.io/v1/namespaces/" + dr.Namespace + "/destination-rule/" + dr.Name
	}
	if subsetName != "" {
		fields["subset"] = subsetName
	}
	s, err := structpb.NewStruct(fields)
	if err != nil {
		panic(err) // only strings and lists of them
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": s}}
}

// dnsAssignment lists a DNS-resolved service's hosts for port, each with
// its weight and the workload telemetry names it by; the locality (none)
// weighs their sum.
func (m *Mesh) dnsAssignment(name string, svc *Service, port uint32) *endpointv3.ClusterLoadAssignment {
	la := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{}}
	total := uint32(0)
	for _, h := range svc.Info.DNSHosts {
		target := port
		if t := h.Ports[port]; t != 0 {
			target = t
		}
		weight := max(h.Weight, 1)
		total += weight
		lbe := &endpointv3.LbEndpoint{
			HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(h.Host, target)}},
			LoadBalancingWeight: wrapperspb.UInt32(weight),
		}
		if e := h.Entry; e != nil {
			rev := e.CanonicalRevision
			if rev == "latest" {
				rev = ""
			}
			workload := strings.Join([]string{e.Workload, svc.GetNamespace(), e.CanonicalName, rev, m.ClusterID}, ";")
			lbe.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"istio": {Fields: map[string]*structpb.Value{"workload": structpb.NewStringValue(workload)}},
			}}
		}
		la.LbEndpoints = append(la.LbEndpoints, lbe)
	}
	la.LoadBalancingWeight = wrapperspb.UInt32(max(total, 1))
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{la}}
}

// inboundCluster sends a target port's traffic on to the application at
// the address it was sent to, from inboundBindAddress. Of the rule's
// policy for the service port only the connection pool applies, so that
// the server takes what its clients may send; the Sidecar resource's
// inbound connection pool for the port, if any, replaces it.
func (m *Mesh) inboundCluster(p Proxy, name string, in inboundPort, policy *networkingapi.TrafficPolicy, dr *networkingv1.DestinationRule) *clusterv3.Cluster {
	b := newClusterBuild(name)
	c := b.c
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
	c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
	b.setUpstreamProtocol(in.protocol)
	pool := policy.GetConnectionPool()
	if scoped := inboundConnectionPool(m.SidecarScope(p), in.target); scoped != nil {
		pool = scoped
	}
	b.applyConnectionPool(pool, policy.GetRetryBudget())
	c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	// Never: the original destinations are the application's own ports.
	// The longest whole seconds a Duration holds.
	c.CleanupInterval = &durationpb.Duration{Seconds: (math.MaxInt64 - 999999999) / 1000000000}
	c.UpstreamBindConfig = &corev3.BindConfig{SourceAddress: &corev3.SocketAddress{
		Address: inboundBindAddress, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0},
	}}
	c.Metadata = clusterMetadata(in.svc, m.DomainSuffix, dr, "")
	return b.finish()
}

// inboundConnectionPool is a Sidecar resource's connection pool for target
// port port: its ingress listener's for the port, else its own.
func inboundConnectionPool(sc *networkingv1.Sidecar, port uint32) *networkingapi.ConnectionPoolSettings {
	if sc == nil {
		return nil
	}
	for _, in := range sc.Spec.GetIngress() {
		if in.GetPort().GetNumber() == port && in.GetConnectionPool() != nil {
			return in.GetConnectionPool()
		}
	}
	return sc.Spec.GetInboundConnectionPool()
}

// passthroughCluster sends to the original destination; inbound, from
// inboundBindAddress.
func passthroughCluster(name string, inbound bool) *clusterv3.Cluster {
	b := newClusterBuild(name)
	c := b.c
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
	c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	b.useDownstreamProtocol()
	// An idle upstream connection to an arbitrary destination is closed
	// after five minutes.
	b.httpOptions().CommonHttpProtocolOptions = &corev3.HttpProtocolOptions{IdleTimeout: durationpb.New(5 * time.Minute)}
	if !inbound {
		c.Filters = []*clusterv3.Filter{{Name: "istio.metadata_exchange", TypedConfig: metadataExchangeConfig()}}
	}
	if inbound {
		c.UpstreamBindConfig = &corev3.BindConfig{SourceAddress: &corev3.SocketAddress{
			Address: inboundBindAddress, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0},
		}}
	}
	return b.finish()
}

// sds names a secret the sidecar's agent serves over its SDS socket
// (sidecar wire contract §2.3).
func sds(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ResourceApiVersion:  corev3.ApiVersion_V3,
		InitialFetchTimeout: durationpb.New(0),
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType:                   corev3.ApiConfigSource_GRPC,
			TransportApiVersion:       corev3.ApiVersion_V3,
			SetNodeOnFirstMessageOnly: true,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"},
			}}},
		}},
	}}
}

// sdsTLSContext is the sidecar's certificate ("default") and roots
// ("ROOTCA") from its agent, checking the peer's identity against sans
// when there are any.
func sdsTLSContext(sans, alpn []string) *tlsv3.CommonTlsContext {
	var match []*matcherv3.StringMatcher
	for _, s := range sans {
		match = append(match, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}})
	}
	return &tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{
			TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
			TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
		},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sds("default")},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			//lint:ignore SA1019 Istio's sidecars check identities in this field
			DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchSubjectAltNames: match},
			ValidationContextSdsSecretConfig: sds("ROOTCA"),
		}},
		AlpnProtocols: alpn,
	}
}

// adsSourceNoWait is ADS without an initial fetch timeout, as a sidecar's
// clusters and listeners name their dependencies.
func adsSourceNoWait() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		InitialFetchTimeout:   durationpb.New(0),
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}
