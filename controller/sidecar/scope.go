package sidecar

import (
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// SidecarScope returns the Sidecar resource that scopes proxy p: the
// oldest one of p's namespace whose workload selector matches p's labels,
// else the oldest of its namespace without a selector, else the oldest of
// the root namespace without a selector; nil when none applies (p sees
// every service exported to it).
func (m *Mesh) SidecarScope(p Proxy) *networkingv1.Sidecar {
	m.readKind(sidecarResources)
	var own, root *networkingv1.Sidecar
	for _, sc := range m.sidecars {
		sel := sc.Spec.GetWorkloadSelector().GetLabels()
		switch {
		case sc.Namespace == p.Namespace && len(sel) > 0:
			if selects(sel, p.Labels) {
				return sc
			}
		case sc.Namespace == p.Namespace:
			if own == nil {
				own = sc
			}
		case sc.Namespace == m.RootNamespace && len(sel) == 0:
			if root == nil {
				root = sc
			}
		}
	}
	if own != nil {
		return own
	}
	return root
}

// egressAllows reports whether a Sidecar's egress hosts let proxy p see a
// service: a host "<namespace>/<dnsName>" matches when the namespace is
// "*", the service's, or "." and the service is in the Sidecar's own
// namespace ("~" matches none), and the name is "*", the service's
// hostname, or a "*.suffix" pattern of it. A Sidecar without egress
// listeners allows everything.
func egressAllows(sc *networkingv1.Sidecar, hostname, serviceNS string) bool {
	if sc == nil || len(sc.Spec.GetEgress()) == 0 {
		return true
	}
	for _, eg := range sc.Spec.GetEgress() {
		for _, h := range eg.GetHosts() {
			ns, name, ok := strings.Cut(h, "/")
			if !ok {
				continue // refused by Istio's validation
			}
			switch ns {
			case "*":
			case ".":
				if serviceNS != sc.Namespace {
					continue
				}
			case "~":
				continue
			default:
				if ns != serviceNS {
					continue
				}
			}
			if name == "*" || hostMatches(name, hostname) {
				return true
			}
		}
	}
	return false
}
