package sidecar

import (
	"math"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	proxyprotocolv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/proxy_protocol/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// httpProtocolOptionsKey is where a cluster's HTTP protocol options go.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// clusterBuild is a cluster being built with its HTTP protocol options:
// the port's protocol, the HTTP/2 upgrade and the connection pool each set
// some of them, so they are kept unmarshalled until finish.
type clusterBuild struct {
	c    *clusterv3.Cluster
	http *httpv3.HttpProtocolOptions
}

// newClusterBuild starts a cluster with what every cluster has: its name,
// stat name, the mesh's connect timeout and no circuit breaking (Envoy's
// defaults, three retries at a time among them, turn a rolling update into
// errors).
func newClusterBuild(name string) *clusterBuild {
	return &clusterBuild{c: &clusterv3.Cluster{
		Name: name, AltStatName: name + ";",
		ConnectTimeout:  durationpb.New(defaultConnectTimeout),
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{defaultThresholds()}},
	}}
}

func defaultThresholds() *clusterv3.CircuitBreakers_Thresholds {
	return &clusterv3.CircuitBreakers_Thresholds{
		MaxConnections:     wrapperspb.UInt32(math.MaxUint32),
		MaxPendingRequests: wrapperspb.UInt32(math.MaxUint32),
		MaxRequests:        wrapperspb.UInt32(math.MaxUint32),
		MaxRetries:         wrapperspb.UInt32(math.MaxUint32),
	}
}

// finish marshals the HTTP protocol options, if any step set one: HTTP/1.1
// upstream when none chose the protocol (Envoy requires a choice).
func (b *clusterBuild) finish() *clusterv3.Cluster {
	if b.http != nil {
		if b.http.UpstreamProtocolOptions == nil {
			b.http.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}},
			}}
		}
		b.c.TypedExtensionProtocolOptions = map[string]*anypb.Any{httpProtocolOptionsKey: mustAny(b.http)}
	}
	return b.c
}

func (b *clusterBuild) httpOptions() *httpv3.HttpProtocolOptions {
	if b.http == nil {
		b.http = &httpv3.HttpProtocolOptions{}
	}
	return b.http
}

// setUpstreamProtocol makes a cluster of an HTTP/2 or gRPC port speak
// HTTP/2, and one of a port whose protocol is detected speak what the
// client spoke.
func (b *clusterBuild) setUpstreamProtocol(protocol string) {
	switch {
	case http2(protocol):
		b.setH2()
	case kindOf(protocol) == kindSniffed:
		b.useDownstreamProtocol()
	}
}

// setH2 makes the cluster speak HTTP/2, unless its protocol is already
// chosen.
func (b *clusterBuild) setH2() {
	if o := b.httpOptions(); o.UpstreamProtocolOptions == nil {
		o.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}}
	}
}

// useDownstreamProtocol makes the cluster speak what the client spoke,
// keeping the HTTP/1.1 options already chosen.
func (b *clusterBuild) useDownstreamProtocol() {
	o := b.httpOptions()
	h1 := o.GetExplicitHttpConfig().GetHttpProtocolOptions()
	if h1 == nil {
		h1 = &corev3.Http1ProtocolOptions{}
	}
	o.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_UseDownstreamProtocolConfig{UseDownstreamProtocolConfig: &httpv3.HttpProtocolOptions_UseDownstreamHttpConfig{
		HttpProtocolOptions: h1, Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
	}}
}

// applyH2Upgrade follows the rule's h2UpgradePolicy on an outbound
// cluster: UPGRADE makes it HTTP/2 (unless useClientProtocol is set); the
// mesh's default policy, DO_NOT_UPGRADE, leaves it.
func (b *clusterBuild) applyH2Upgrade(pool *networkingapi.ConnectionPoolSettings) {
	h := pool.GetHttp()
	if !h.GetUseClientProtocol() && h.GetH2UpgradePolicy() == networkingapi.ConnectionPoolSettings_HTTPSettings_UPGRADE {
		b.setH2()
	}
}

// applyConnectionPool sets the circuit breakers, connect timeout, TCP
// keepalive and HTTP connection limits of a connection pool (an unset pool
// is the empty one: defaults) and the retry budget. A zero limit is
// Istio's "unset", not zero.
func (b *clusterBuild) applyConnectionPool(pool *networkingapi.ConnectionPoolSettings, budget *networkingapi.TrafficPolicy_RetryBudget) {
	c := b.c
	t := defaultThresholds()
	applyRetryBudget(t, budget)
	h, tcp := pool.GetHttp(), pool.GetTcp()
	if n := h.GetHttp2MaxRequests(); n > 0 {
		t.MaxRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := h.GetHttp1MaxPendingRequests(); n > 0 {
		t.MaxPendingRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := h.GetMaxRetries(); n > 0 {
		t.MaxRetries = wrapperspb.UInt32(uint32(n))
	}
	if n := tcp.GetMaxConnections(); n > 0 {
		t.MaxConnections = wrapperspb.UInt32(uint32(n))
	}
	c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{t}}
	c.ConnectTimeout = durationpb.New(defaultConnectTimeout)
	if d := tcp.GetConnectTimeout(); d != nil {
		c.ConnectTimeout = d
	}
	if ka := tcp.GetTcpKeepalive(); ka != nil {
		// Empty: SO_KEEPALIVE with the kernel's timings.
		k := &corev3.TcpKeepalive{}
		if ka.GetProbes() > 0 {
			k.KeepaliveProbes = wrapperspb.UInt32(ka.GetProbes())
		}
		if ka.GetTime() != nil {
			k.KeepaliveTime = wrapperspb.UInt32(uint32(ka.GetTime().GetSeconds()))
		}
		if ka.GetInterval() != nil {
			k.KeepaliveInterval = wrapperspb.UInt32(uint32(ka.GetInterval().GetSeconds()))
		}
		c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: k}
	}

	idle := h.GetIdleTimeout()
	if idle == nil {
		idle = tcp.GetIdleTimeout()
	}
	perConn, streams, keepalive, lifetime := uint32(h.GetMaxRequestsPerConnection()), uint32(h.GetMaxConcurrentStreams()), h.GetHttp2KeepAlive(), tcp.GetMaxConnectionDuration()
	if idle != nil || perConn > 0 || streams > 0 || keepalive != nil || lifetime != nil {
		o := b.httpOptions()
		if o.CommonHttpProtocolOptions == nil {
			o.CommonHttpProtocolOptions = &corev3.HttpProtocolOptions{}
		}
		common := o.CommonHttpProtocolOptions
		if idle != nil {
			common.IdleTimeout = idle
		}
		if perConn > 0 {
			common.MaxRequestsPerConnection = wrapperspb.UInt32(perConn)
		}
		if lifetime != nil {
			common.MaxConnectionDuration = lifetime
		}
		if h2 := o.GetExplicitHttpConfig().GetHttp2ProtocolOptions(); h2 != nil {
			if streams > 0 {
				h2.MaxConcurrentStreams = wrapperspb.UInt32(streams)
			}
			if keepalive != nil {
				h2.ConnectionKeepalive = &corev3.KeepaliveSettings{Interval: keepalive.GetInterval(), Timeout: keepalive.GetTimeout()}
			}
		}
	}
	if h.GetUseClientProtocol() {
		b.useDownstreamProtocol()
	}
}

// applyRetryBudget bounds retries to a share of the active requests (20 %
// and three at a time unless the budget says otherwise).
func applyRetryBudget(t *clusterv3.CircuitBreakers_Thresholds, budget *networkingapi.TrafficPolicy_RetryBudget) {
	if budget == nil {
		return
	}
	percent := 20.0
	if p := budget.GetPercent(); p != nil {
		percent = p.GetValue()
	}
	concurrency := uint32(3)
	if n := budget.GetMinRetryConcurrency(); n > 0 {
		concurrency = n
	}
	t.RetryBudget = &clusterv3.CircuitBreakers_Thresholds_RetryBudget{
		BudgetPercent: &typev3.Percent{Value: percent}, BudgetInterval: budget.GetBudgetInterval(),
		MinRetryConcurrency: wrapperspb.UInt32(concurrency),
	}
}

// applyOutlierDetection ejects endpoints on consecutive errors (never on
// success rate) and sets the panic threshold to the rule's minimum health
// percentage: 0 unless set, so that Envoy does not spread traffic over
// endpoints that are not ready when few are. A service whose traffic
// distribution needs endpoint health to spill over keeps the threshold at
// 0 whatever the rule says.
func applyOutlierDetection(c *clusterv3.Cluster, od *networkingapi.OutlierDetection, locationAware bool) {
	if od == nil {
		return
	}
	out := &clusterv3.OutlierDetection{EnforcingSuccessRate: wrapperspb.UInt32(0)}
	enforce := func(n uint32) *wrapperspb.UInt32Value {
		if n > 0 {
			return wrapperspb.UInt32(100)
		}
		return wrapperspb.UInt32(0)
	}
	if n := od.GetConsecutive_5XxErrors(); n != nil {
		out.Consecutive_5Xx = wrapperspb.UInt32(n.GetValue())
		out.EnforcingConsecutive_5Xx = enforce(n.GetValue())
	}
	if n := od.GetConsecutiveGatewayErrors(); n != nil {
		out.ConsecutiveGatewayFailure = wrapperspb.UInt32(n.GetValue())
		out.EnforcingConsecutiveGatewayFailure = enforce(n.GetValue())
	}
	out.Interval = od.GetInterval()
	out.BaseEjectionTime = od.GetBaseEjectionTime()
	if p := od.GetMaxEjectionPercent(); p > 0 {
		out.MaxEjectionPercent = wrapperspb.UInt32(uint32(p))
	}
	if od.GetSplitExternalLocalOriginErrors() {
		out.SplitExternalLocalOriginErrors = true
		if n := od.GetConsecutiveLocalOriginFailures().GetValue(); n > 0 {
			out.ConsecutiveLocalOriginFailure = wrapperspb.UInt32(n)
			out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(100)
		}
		out.EnforcingLocalOriginSuccessRate = wrapperspb.UInt32(0)
	}
	c.OutlierDetection = out
	if minHealth := od.GetMinHealthPercent(); minHealth >= 0 {
		if locationAware {
			minHealth = 0
		}
		c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: float64(minHealth)}
	}
}

// locationAware reports a service whose traffic distribution prefers
// close endpoints (PreferSameZone, PreferClose, PreferSameNode): only
// endpoint health tells a client when to spill over, so its unhealthy
// endpoints are always sent and the panic threshold is always 0.
func locationAware(s *Service) bool {
	if s == nil {
		return false
	}
	lb := s.GetLoadBalancing()
	return lb.GetMode() == workloadapi.LoadBalancing_FAILOVER && len(lb.GetRoutingPreference()) > 0
}

// applyLoadBalancer sets an outbound cluster's load balancing: the panic
// threshold at 0 unless outlier detection set it (unhealthy endpoints are
// sent, and a client must never spread traffic over them), the locality
// settings, then the algorithm (least request unless the rule says
// otherwise; an original destination chooses its own endpoint).
func applyLoadBalancer(c *clusterv3.Cluster, lb *networkingapi.LoadBalancerSettings, locationAware bool) {
	if c.CommonLbConfig.HealthyPanicThreshold == nil {
		c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: 0}
	}
	applyLocalityConfig(c, lb, locationAware)
	if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		return
	}
	// LEAST_CONN (deprecated) and LEAST_REQUEST are the default.
	switch lb.GetSimple() {
	case networkingapi.LoadBalancerSettings_RANDOM:
		c.LbPolicy = clusterv3.Cluster_RANDOM
	case networkingapi.LoadBalancerSettings_ROUND_ROBIN:
		c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
		if s := slowStart(lb); s != nil {
			c.LbConfig = &clusterv3.Cluster_RoundRobinLbConfig_{RoundRobinLbConfig: &clusterv3.Cluster_RoundRobinLbConfig{SlowStartConfig: s}}
		}
	case networkingapi.LoadBalancerSettings_PASSTHROUGH:
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.LoadAssignment = nil
	default:
		c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		if s := slowStart(lb); s != nil {
			c.LbConfig = &clusterv3.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &clusterv3.Cluster_LeastRequestLbConfig{SlowStartConfig: s}}
		}
	}
	applyConsistentHash(c, lb.GetConsistentHash())
}

// slowStart is the rule's warmup: a new endpoint's share grows over the
// window (linearly unless the aggression says otherwise, from 10 % unless
// the minimum says otherwise).
func slowStart(lb *networkingapi.LoadBalancerSettings) *clusterv3.Cluster_SlowStartConfig {
	if w := lb.GetWarmup(); w != nil {
		aggression, minimum := 1.0, 10.0
		if a := w.GetAggression(); a != nil {
			aggression = a.GetValue()
		}
		if m := w.GetMinimumPercent(); m != nil {
			minimum = m.GetValue()
		}
		// The runtime key is not a key anyone sets: Envoy requires one.
		return &clusterv3.Cluster_SlowStartConfig{
			SlowStartWindow:  w.GetDuration(),
			Aggression:       &corev3.RuntimeDouble{DefaultValue: aggression, RuntimeKey: "("},
			MinWeightPercent: &typev3.Percent{Value: minimum},
		}
	}
	if d := lb.GetWarmupDurationSecs(); d != nil {
		return &clusterv3.Cluster_SlowStartConfig{SlowStartWindow: d}
	}
	return nil
}

// applyConsistentHash makes the cluster hash requests onto endpoints (the
// hash itself is the route's hash policy): Maglev, or a ring of at least
// the rule's size (Envoy's 1,024 for the older field when unset). A
// warmup's config may stay beside it, as in istiod: Envoy reads only the
// config of the policy it runs.
func applyConsistentHash(c *clusterv3.Cluster, ch *networkingapi.LoadBalancerSettings_ConsistentHashLB) {
	switch {
	case ch == nil:
	case ch.GetMaglev() != nil:
		c.LbPolicy = clusterv3.Cluster_MAGLEV
		if n := ch.GetMaglev().GetTableSize(); n != 0 {
			c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{TableSize: wrapperspb.UInt64(n)}}
		}
	case ch.GetRingHash() != nil:
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		if n := ch.GetRingHash().GetMinimumRingSize(); n != 0 {
			c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{MinimumRingSize: wrapperspb.UInt64(n)}}
		}
	default:
		//lint:ignore SA1019 the field Istio's rules still set
		size := ch.GetMinimumRingSize()
		if size == 0 {
			size = 1024
		}
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{MinimumRingSize: wrapperspb.UInt64(size)}}
	}
}

// applyLocalityConfig sets how the cluster weighs localities. Locality
// weights apply when the rule distributes traffic between localities, or
// fails over by locality (which needs outlier detection, or a traffic
// distribution, to ever fail over); zone-aware routing replaces them when
// the rule asks for it. The priorities themselves are the endpoint
// assignment's.
func applyLocalityConfig(c *clusterv3.Cluster, lb *networkingapi.LoadBalancerSettings, locationAware bool) {
	if za := lb.GetZoneAwareLbSetting(); za != nil {
		cfg := &clusterv3.Cluster_CommonLbConfig_ZoneAwareLbConfig{}
		if n := za.GetMinClusterSize(); n != nil {
			cfg.MinClusterSize = wrapperspb.UInt64(uint64(n.GetValue()))
		}
		if e := za.GetEnabled(); e != nil && !e.GetValue() {
			cfg.RoutingEnabled = &typev3.Percent{Value: 0}
		}
		c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_ZoneAwareLbConfig_{ZoneAwareLbConfig: cfg}
		return
	}
	weighted := false
	switch setting := lb.GetLocalityLbSetting(); {
	case setting != nil:
		// The rule's setting replaces the traffic distribution's.
		if e := setting.GetEnabled(); e != nil && !e.GetValue() {
			return
		}
		failover := c.OutlierDetection != nil
		weighted = setting.GetDistribute() != nil || failover && (setting.GetFailover() != nil || setting.GetFailoverPriority() != nil)
	case locationAware:
		// Failover by network, region and zone (and node), always.
		weighted = true
	}
	if weighted {
		c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
		}
	}
}

// applyProxyProtocol sends a PROXY protocol header of the rule's version
// before anything else on every upstream connection, around whatever
// transport the cluster has (plaintext when it has none).
func applyProxyProtocol(c *clusterv3.Cluster, pp *networkingapi.TrafficPolicy_ProxyProtocol) {
	if pp == nil {
		return
	}
	wrap := func(inner *corev3.TransportSocket) *corev3.TransportSocket {
		return &corev3.TransportSocket{Name: "envoy.transport_sockets.upstream_proxy_protocol", ConfigType: &corev3.TransportSocket_TypedConfig{
			TypedConfig: mustAny(&proxyprotocolv3.ProxyProtocolUpstreamTransport{
				Config:          &corev3.ProxyProtocolConfig{Version: corev3.ProxyProtocolConfig_Version(pp.GetVersion())},
				TransportSocket: inner,
			}),
		}}
	}
	if c.TransportSocket == nil && len(c.TransportSocketMatches) == 0 {
		c.TransportSocket = wrap(rawBufferSocket())
		return
	}
	if c.TransportSocket != nil {
		c.TransportSocket = wrap(c.TransportSocket)
	}
	for _, m := range c.TransportSocketMatches {
		m.TransportSocket = wrap(m.TransportSocket)
	}
}
