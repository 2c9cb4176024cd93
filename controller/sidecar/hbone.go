package sidecar

import (
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	originaldstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	internalupstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/internal_upstream/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A sidecar reaches workloads of the ambient mesh over HBONE (sidecar wire
// contract §9): their endpoints are internal addresses of the
// ConnectOriginate listener, whose TCP proxy opens an HTTP/2 CONNECT to
// the original destination through the ConnectOriginate cluster, mutual
// TLS to the destination's port 15008.
const (
	ConnectOriginate    = "connect_originate"
	originalDstMetadata = "envoy.filters.listener.original_dst"
	hbonePort           = 15008
)

// hboneMatch sends the endpoints marked for tunnelling to the internal
// listener.
func hboneMatch() *clusterv3.Cluster_TransportSocketMatch { return hboneMatchAround(rawBufferSocket()) }

// hboneMatchAround sends endpoints marked for a tunnel through the
// connect_originate listener, with inner (plaintext, or the TLS the
// destination gets) inside the tunnel.
func hboneMatchAround(inner *corev3.TransportSocket) *clusterv3.Cluster_TransportSocketMatch {
	return &clusterv3.Cluster_TransportSocketMatch{
		Name:  "hbone",
		Match: &structpb.Struct{Fields: map[string]*structpb.Value{"tunnel": structpb.NewStringValue("http")}},
		TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.internal_upstream", ConfigType: &corev3.TransportSocket_TypedConfig{
			TypedConfig: mustAny(&internalupstreamv3.InternalUpstreamTransport{
				// The tunnel's destination, and the peer metadata Istio's
				// telemetry reads on both ends.
				PassthroughMetadata: []*internalupstreamv3.InternalUpstreamTransport_MetadataValueSource{
					{Kind: hostMetadata(), Name: originalDstMetadata},
					{Kind: &metadatav3.MetadataKind{Kind: &metadatav3.MetadataKind_Cluster_{Cluster: &metadatav3.MetadataKind_Cluster{}}}, Name: "istio"},
					{Kind: hostMetadata(), Name: "istio"},
				},
				TransportSocket: inner,
			}),
		}},
	}
}

// connectOriginateListener tunnels each connection handed to it to its
// original destination.
func connectOriginateListener() *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:              ConnectOriginate,
		UseOriginalDst:    wrapperspb.Bool(false),
		ListenerSpecifier: &listenerv3.Listener_InternalListener{InternalListener: &listenerv3.Listener_InternalListenerConfig{}},
		ListenerFilters: []*listenerv3.ListenerFilter{{
			Name:       originalDstMetadata,
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&originaldstv3.OriginalDst{})},
		}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.tcp_proxy",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
				StatPrefix:       ConnectOriginate,
				ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: ConnectOriginate},
				TunnelingConfig:  &tcpproxyv3.TcpProxy_TunnelingConfig{Hostname: "%DOWNSTREAM_LOCAL_ADDRESS%"},
			})},
		}}}},
	}
}

// connectOriginateCluster opens HTTP/2 connections with mutual TLS 1.3 to
// port 15008 of the original destination, accepting any identity of the
// trust domain (the destination's node proxy presents the workload's).
func connectOriginateCluster(trustDomain string) *clusterv3.Cluster {
	c := newClusterBuild(ConnectOriginate).c
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
	c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	c.CleanupInterval = durationpb.New(time.Minute)
	c.LbConfig = &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
		UpstreamPortOverride: wrapperspb.UInt32(hbonePort),
		MetadataKey: &metadatav3.MetadataKey{Key: originalDstMetadata, Path: []*metadatav3.MetadataKey_PathSegment{{
			Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: "waypoint"},
		}}},
	}}
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
		CommonHttpProtocolOptions: &corev3.HttpProtocolOptions{IdleTimeout: durationpb.New(time.Hour)},
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{AllowConnect: true}},
		}},
	})}
	ctx := sdsTLSContext(nil, []string{"h2"})
	ctx.TlsParams.TlsMinimumProtocolVersion = tlsv3.TlsParameters_TLSv1_3
	ctx.GetCombinedValidationContext().DefaultValidationContext = &tlsv3.CertificateValidationContext{
		MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
			SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + trustDomain + "/"}},
		}},
	}
	c.TransportSocket = &corev3.TransportSocket{Name: "tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.UpstreamTlsContext{CommonTlsContext: ctx})}}
	return c
}

func hostMetadata() *metadatav3.MetadataKind {
	return &metadatav3.MetadataKind{Kind: &metadatav3.MetadataKind_Host_{Host: &metadatav3.MetadataKind_Host{}}}
}
