package sidecar

import (
	"slices"

	"google.golang.org/protobuf/proto"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// portPolicy is a traffic policy with its port-level settings for port
// applied over the rest (Istio replaces each top-level field a port-level
// policy sets).
func portPolicy(tp *networkingapi.TrafficPolicy, port uint32) *networkingapi.TrafficPolicy {
	if tp == nil {
		return nil
	}
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() != port {
			continue
		}
		out := proto.Clone(tp).(*networkingapi.TrafficPolicy)
		out.PortLevelSettings = nil
		if pl.GetLoadBalancer() != nil {
			out.LoadBalancer = pl.GetLoadBalancer()
		}
		if pl.GetConnectionPool() != nil {
			out.ConnectionPool = pl.GetConnectionPool()
		}
		if pl.GetOutlierDetection() != nil {
			out.OutlierDetection = pl.GetOutlierDetection()
		}
		if pl.GetTls() != nil {
			out.Tls = pl.GetTls()
		}
		return out
	}
	return tp
}

// mergePolicy lays a subset's policy over its rule's: each field the
// subset sets replaces the rule's.
func mergePolicy(base, over *networkingapi.TrafficPolicy) *networkingapi.TrafficPolicy {
	if over == nil {
		return base
	}
	if base == nil {
		return over
	}
	out := proto.Clone(base).(*networkingapi.TrafficPolicy)
	if over.GetLoadBalancer() != nil {
		out.LoadBalancer = over.GetLoadBalancer()
	}
	if over.GetConnectionPool() != nil {
		out.ConnectionPool = over.GetConnectionPool()
	}
	if over.GetOutlierDetection() != nil {
		out.OutlierDetection = over.GetOutlierDetection()
	}
	if over.GetTls() != nil {
		out.Tls = over.GetTls()
	}
	return out
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
// workload with labels lbls in namespace ns: the oldest policy that
// selects the workload (its port-level mode first), then the namespace's,
// then the root namespace's, each UNSET deferring to the next; PERMISSIVE
// when none decides.
func (m *Mesh) MTLSMode(ns string, lbls map[string]string, port uint32) securityapi.PeerAuthentication_MutualTLS_Mode {
	var workload, namespace, mesh *securityapi.PeerAuthentication
	for _, pa := range m.peerAuthentications {
		sel := pa.Spec.GetSelector().GetMatchLabels()
		switch {
		case pa.Namespace == ns && len(sel) > 0 && selects(sel, lbls) && workload == nil:
			workload = &pa.Spec
		case pa.Namespace == ns && len(sel) == 0 && namespace == nil:
			namespace = &pa.Spec
		case pa.Namespace == m.RootNamespace && len(sel) == 0 && mesh == nil:
			mesh = &pa.Spec
		}
	}
	if workload != nil {
		if pm, ok := workload.GetPortLevelMtls()[port]; ok && pm.GetMode() != securityapi.PeerAuthentication_MutualTLS_UNSET {
			return pm.GetMode()
		}
	}
	for _, pa := range []*securityapi.PeerAuthentication{workload, namespace, mesh} {
		if mode := pa.GetMtls().GetMode(); pa != nil && mode != securityapi.PeerAuthentication_MutualTLS_UNSET {
			return mode
		}
	}
	return securityapi.PeerAuthentication_MutualTLS_PERMISSIVE
}

func selects(sel, lbls map[string]string) bool {
	for k, v := range sel {
		if got, ok := lbls[k]; !ok || got != v {
			return false
		}
	}
	return true
}
