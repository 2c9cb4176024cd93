package sidecar

import (
	"math"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
)

// TestTrafficPolicyOnCluster: each part of a DestinationRule's traffic
// policy lands on an outbound EDS cluster as istiod puts it there.
func TestTrafficPolicyOnCluster(t *testing.T) {
	sec := durationpb.New
	unlimited := wrapperspb.UInt32(math.MaxUint32)
	thresholds := func(edit func(*clusterv3.CircuitBreakers_Thresholds)) *clusterv3.CircuitBreakers {
		th := &clusterv3.CircuitBreakers_Thresholds{MaxConnections: unlimited, MaxPendingRequests: unlimited, MaxRequests: unlimited, MaxRetries: unlimited}
		if edit != nil {
			edit(th)
		}
		return &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{th}}
	}
	base := func(edit func(*clusterv3.Cluster)) *clusterv3.Cluster {
		c := &clusterv3.Cluster{
			Name: "c", AltStatName: "c;", ConnectTimeout: sec(10 * time.Second), CircuitBreakers: thresholds(nil),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			LbPolicy:             clusterv3.Cluster_LEAST_REQUEST,
			CommonLbConfig:       &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{}},
		}
		if edit != nil {
			edit(c)
		}
		return c
	}
	protocolOptions := func(o *httpv3.HttpProtocolOptions) map[string]*anypb.Any {
		return map[string]*anypb.Any{httpProtocolOptionsKey: mustAny(o)}
	}
	h2 := func(h2 *corev3.Http2ProtocolOptions) *httpv3.HttpProtocolOptions_ExplicitHttpConfig_ {
		return &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: h2},
		}}
	}
	for _, tt := range []struct {
		name     string
		protocol string
		policy   *networkingapi.TrafficPolicy
		aware    bool
		want     *clusterv3.Cluster
	}{
		{name: "no rule: panic threshold off, least request", protocol: "TCP", want: base(nil)},
		{
			name: "connection pool", protocol: "HTTP2",
			policy: &networkingapi.TrafficPolicy{ConnectionPool: &networkingapi.ConnectionPoolSettings{
				Tcp: &networkingapi.ConnectionPoolSettings_TCPSettings{
					MaxConnections: 7, ConnectTimeout: sec(time.Second), MaxConnectionDuration: sec(time.Hour), IdleTimeout: sec(time.Minute),
					TcpKeepalive: &networkingapi.ConnectionPoolSettings_TCPSettings_TcpKeepalive{Probes: 3, Time: sec(time.Minute), Interval: sec(10 * time.Second)},
				},
				Http: &networkingapi.ConnectionPoolSettings_HTTPSettings{
					Http1MaxPendingRequests: 1, Http2MaxRequests: 2, MaxRetries: 3, MaxRequestsPerConnection: 4, MaxConcurrentStreams: 5,
					Http2KeepAlive: &networkingapi.ConnectionPoolSettings_HTTPSettings_ConnectionKeepalive{Interval: sec(time.Second), Timeout: sec(2 * time.Second)},
				},
			}},
			want: base(func(c *clusterv3.Cluster) {
				c.ConnectTimeout = sec(time.Second)
				c.CircuitBreakers = thresholds(func(th *clusterv3.CircuitBreakers_Thresholds) {
					th.MaxConnections, th.MaxPendingRequests, th.MaxRequests, th.MaxRetries = wrapperspb.UInt32(7), wrapperspb.UInt32(1), wrapperspb.UInt32(2), wrapperspb.UInt32(3)
				})
				c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: &corev3.TcpKeepalive{
					KeepaliveProbes: wrapperspb.UInt32(3), KeepaliveTime: wrapperspb.UInt32(60), KeepaliveInterval: wrapperspb.UInt32(10),
				}}
				c.TypedExtensionProtocolOptions = protocolOptions(&httpv3.HttpProtocolOptions{
					CommonHttpProtocolOptions: &corev3.HttpProtocolOptions{IdleTimeout: sec(time.Minute), MaxRequestsPerConnection: wrapperspb.UInt32(4), MaxConnectionDuration: sec(time.Hour)},
					UpstreamProtocolOptions: h2(&corev3.Http2ProtocolOptions{
						MaxConcurrentStreams: wrapperspb.UInt32(5),
						ConnectionKeepalive:  &corev3.KeepaliveSettings{Interval: sec(time.Second), Timeout: sec(2 * time.Second)},
					}),
				})
			}),
		},
		{
			name: "h2 upgrade of an HTTP port", protocol: "HTTP",
			policy: &networkingapi.TrafficPolicy{ConnectionPool: &networkingapi.ConnectionPoolSettings{Http: &networkingapi.ConnectionPoolSettings_HTTPSettings{
				H2UpgradePolicy: networkingapi.ConnectionPoolSettings_HTTPSettings_UPGRADE,
			}}},
			want: base(func(c *clusterv3.Cluster) {
				c.TypedExtensionProtocolOptions = protocolOptions(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: h2(&corev3.Http2ProtocolOptions{})})
			}),
		},
		{
			name: "outlier detection with Maglev keeps both", protocol: "TCP",
			policy: &networkingapi.TrafficPolicy{
				OutlierDetection: &networkingapi.OutlierDetection{
					Consecutive_5XxErrors: wrapperspb.UInt32(5), ConsecutiveGatewayErrors: wrapperspb.UInt32(0), Interval: sec(time.Second),
					BaseEjectionTime: sec(time.Minute), MaxEjectionPercent: 40, MinHealthPercent: 30,
					SplitExternalLocalOriginErrors: true, ConsecutiveLocalOriginFailures: wrapperspb.UInt32(2),
				},
				LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{
					HashKey:       &networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName{HttpHeaderName: "x-user"},
					HashAlgorithm: &networkingapi.LoadBalancerSettings_ConsistentHashLB_Maglev{Maglev: &networkingapi.LoadBalancerSettings_ConsistentHashLB_MagLev{TableSize: 65537}},
				}}},
			},
			want: base(func(c *clusterv3.Cluster) {
				c.OutlierDetection = &clusterv3.OutlierDetection{
					EnforcingSuccessRate: wrapperspb.UInt32(0),
					Consecutive_5Xx:      wrapperspb.UInt32(5), EnforcingConsecutive_5Xx: wrapperspb.UInt32(100),
					ConsecutiveGatewayFailure: wrapperspb.UInt32(0), EnforcingConsecutiveGatewayFailure: wrapperspb.UInt32(0),
					Interval: sec(time.Second), BaseEjectionTime: sec(time.Minute), MaxEjectionPercent: wrapperspb.UInt32(40),
					SplitExternalLocalOriginErrors: true, ConsecutiveLocalOriginFailure: wrapperspb.UInt32(2),
					EnforcingConsecutiveLocalOriginFailure: wrapperspb.UInt32(100), EnforcingLocalOriginSuccessRate: wrapperspb.UInt32(0),
				}
				c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: 30}
				c.LbPolicy = clusterv3.Cluster_MAGLEV
				c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{TableSize: wrapperspb.UInt64(65537)}}
			}),
		},
		{
			name: "a traffic distribution keeps the panic threshold off and weighs localities", protocol: "TCP", aware: true,
			policy: &networkingapi.TrafficPolicy{OutlierDetection: &networkingapi.OutlierDetection{MinHealthPercent: 30}},
			want: base(func(c *clusterv3.Cluster) {
				c.OutlierDetection = &clusterv3.OutlierDetection{EnforcingSuccessRate: wrapperspb.UInt32(0)}
				c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}
			}),
		},
		{
			name: "round robin with warmup", protocol: "TCP",
			policy: &networkingapi.TrafficPolicy{LoadBalancer: &networkingapi.LoadBalancerSettings{
				LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_ROUND_ROBIN},
				Warmup:   &networkingapi.WarmupConfiguration{Duration: sec(time.Minute), Aggression: wrapperspb.Double(2)},
			}},
			want: base(func(c *clusterv3.Cluster) {
				c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
				c.LbConfig = &clusterv3.Cluster_RoundRobinLbConfig_{RoundRobinLbConfig: &clusterv3.Cluster_RoundRobinLbConfig{SlowStartConfig: &clusterv3.Cluster_SlowStartConfig{
					SlowStartWindow: sec(time.Minute), Aggression: &corev3.RuntimeDouble{DefaultValue: 2, RuntimeKey: "("}, MinWeightPercent: &typev3.Percent{Value: 10},
				}}}
			}),
		},
		{
			name: "PASSTHROUGH sends to the original destination", protocol: "TCP",
			policy: &networkingapi.TrafficPolicy{LoadBalancer: &networkingapi.LoadBalancerSettings{
				LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_PASSTHROUGH},
			}},
			want: base(func(c *clusterv3.Cluster) {
				c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
				c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
			}),
		},
		{
			name: "retry budget", protocol: "TCP",
			policy: &networkingapi.TrafficPolicy{RetryBudget: &networkingapi.TrafficPolicy_RetryBudget{Percent: &wrapperspb.DoubleValue{Value: 25}}},
			want: base(func(c *clusterv3.Cluster) {
				c.CircuitBreakers = thresholds(func(th *clusterv3.CircuitBreakers_Thresholds) {
					th.RetryBudget = &clusterv3.CircuitBreakers_Thresholds_RetryBudget{BudgetPercent: &typev3.Percent{Value: 25}, MinRetryConcurrency: wrapperspb.UInt32(3)}
				})
			}),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newClusterBuild("c")
			b.c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
			b.c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
			b.setUpstreamProtocol(tt.protocol)
			b.applyH2Upgrade(tt.policy.GetConnectionPool())
			b.applyConnectionPool(tt.policy.GetConnectionPool(), tt.policy.GetRetryBudget())
			applyOutlierDetection(b.c, tt.policy.GetOutlierDetection(), tt.aware)
			applyLoadBalancer(b.c, tt.policy.GetLoadBalancer(), tt.aware)
			if diff := cmp.Diff(tt.want, b.finish(), protocmp.Transform()); diff != "" {
				t.Errorf("cluster (-want +got):\n%s", diff)
			}
		})
	}
}
