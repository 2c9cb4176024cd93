package sidecar

import (
	"slices"

	"google.golang.org/protobuf/proto"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
)

// portPolicy is a traffic policy as it applies to port. Port-level
// settings for port, when there are any, replace the policy's connection
// pool, load balancer, outlier detection and TLS as a whole: a field they
// leave out takes its default, not the policy's (as in Istio). portLevel
// says whether they did.
func portPolicy(tp *networkingapi.TrafficPolicy, port uint32) (_ *networkingapi.TrafficPolicy, portLevel bool) {
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			return &networkingapi.TrafficPolicy{
				LoadBalancer: pl.GetLoadBalancer(), ConnectionPool: pl.GetConnectionPool(),
				OutlierDetection: pl.GetOutlierDetection(), Tls: pl.GetTls(),
			}, true
		}
	}
	return tp, false
}

// mergePolicy lays a subset's policy (for the port) over its rule's: each
// field the subset sets replaces the rule's; with portLevel (the subset's
// policy came from port-level settings) the four fields port-level settings
// have always do, and the rest (tunnel, PROXY protocol, retry budget), which
// port-level settings cannot set, only when the subset sets them.
func mergePolicy(base, over *networkingapi.TrafficPolicy, portLevel bool) *networkingapi.TrafficPolicy {
	if over == nil {
		return base
	}
	if base == nil {
		return over
	}
	out := proto.Clone(base).(*networkingapi.TrafficPolicy)
	if over.GetLoadBalancer() != nil || portLevel {
		out.LoadBalancer = over.GetLoadBalancer()
	}
	if over.GetConnectionPool() != nil || portLevel {
		out.ConnectionPool = over.GetConnectionPool()
	}
	if over.GetOutlierDetection() != nil || portLevel {
		out.OutlierDetection = over.GetOutlierDetection()
	}
	if over.GetTls() != nil || portLevel {
		out.Tls = over.GetTls()
	}
	if over.GetTunnel() != nil {
		out.Tunnel = over.GetTunnel()
	}
	if over.GetProxyProtocol() != nil {
		out.ProxyProtocol = over.GetProxyProtocol()
	}
	if over.GetRetryBudget() != nil {
		out.RetryBudget = over.GetRetryBudget()
	}
	return out
}

// clusterPolicy is the traffic policy of a rule's cluster for port and
// subset ("" for none): the rule's, for the port, under the subset's, for
// the port. ok is false for a subset the rule does not have.
func clusterPolicy(dr *networkingv1.DestinationRule, port uint32, subsetName string) (_ *networkingapi.TrafficPolicy, ok bool) {
	var policy *networkingapi.TrafficPolicy
	if dr != nil {
		policy, _ = portPolicy(dr.Spec.GetTrafficPolicy(), port)
	}
	if subsetName == "" {
		return policy, true
	}
	ss := subset(dr, subsetName)
	if ss == nil {
		return nil, false
	}
	sp, portLevel := portPolicy(ss.GetTrafficPolicy(), port)
	return mergePolicy(policy, sp, portLevel), true
}

// subset returns the rule's subset called name, or nil.
func subset(dr *networkingv1.DestinationRule, name string) *networkingapi.Subset {
	if dr == nil {
		return nil
	}
	i := slices.IndexFunc(dr.Spec.GetSubsets(), func(s *networkingapi.Subset) bool { return s.GetName() == name })
	if i < 0 {
		return nil
	}
	return dr.Spec.GetSubsets()[i]
}

// MTLSMode is the PeerAuthentication mode of target port port of a
// workload with labels lbls in namespace ns, as istiod decides it for
// sidecars (securitypolicy.EmptySelectorNamespaceWide): the oldest policy
// that selects the workload (its port-level mode first), then the
// namespace's, then the root namespace's, each UNSET deferring to the
// next; PERMISSIVE when none decides.
func (m *Mesh) MTLSMode(ns string, lbls map[string]string, port uint32) securityapi.PeerAuthentication_MutualTLS_Mode {
	m.readKind(peerAuthentications)
	return securitypolicy.Decide(slices.Values(m.peerAuthentications), m.RootNamespace, ns, lbls, securitypolicy.EmptySelectorNamespaceWide).PortMode(port)
}

func selects(sel, lbls map[string]string) bool {
	for k, v := range sel {
		if got, ok := lbls[k]; !ok || got != v {
			return false
		}
	}
	return true
}
