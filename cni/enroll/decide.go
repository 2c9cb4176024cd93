// Package enroll decides which pods the CNI agent puts in the mesh
// (docs/wire-contract.md §4.5) and with which per-pod redirection settings
// (docs/wire-contract.md §4.2). It is pure: Kubernetes objects in, a decision
// out.
package enroll

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/cni/redirect"
)

// Labels and annotations read and written.
const (
	LabelDataplaneMode = "istio.io/dataplane-mode"
	ModeAmbient        = "ambient"
	ModeNone           = "none"

	AnnotationSidecarStatus  = "sidecar.istio.io/status"
	AnnotationBypassInbound  = "ambient.istio.io/bypass-inbound-capture"
	AnnotationDNSCapture     = "ambient.istio.io/dns-capture"
	AnnotationRerouteVirtual = "istio.io/reroute-virtual-interfaces"
	// AnnotationRedirection is "enabled" once the pod's traffic goes
	// through the node proxy, "pending" while the proxy has not taken it.
	AnnotationRedirection = "ambient.istio.io/redirection"
	RedirectionEnabled    = "enabled"
	RedirectionPending    = "pending"
)

// Config is the node-wide part of the decision.
type Config struct {
	// SystemNamespace holds the node proxy pods (app=ztunnel), never
	// enrolled.
	SystemNamespace string
	// ExcludedNamespaces are never enrolled (default kube-system).
	ExcludedNamespaces []string
	// DNSCapture is the default for pods without the annotation.
	DNSCapture bool
}

// Decision is whether a pod is in the mesh, and why.
type Decision struct {
	Enroll bool
	// Reason says why, for logs, events and the pod's condition.
	Reason string
	Pod    redirect.PodConfig
}

// Decide applies the enablement selector: the pod's label, else its
// namespace's; host-network, sidecar-injected, node-proxy and excluded
// pods are never enrolled. ns may be nil when the namespace is unknown.
func Decide(pod *corev1.Pod, ns *corev1.Namespace, cfg Config) Decision {
	switch {
	case pod.Spec.HostNetwork:
		return Decision{Reason: "host-network pod"}
	case pod.Annotations[AnnotationSidecarStatus] != "":
		return Decision{Reason: "pod has a sidecar"}
	case pod.Namespace == cfg.SystemNamespace && pod.Labels["app"] == "ztunnel":
		return Decision{Reason: "node proxy pod"}
	}
	for _, ex := range cfg.ExcludedNamespaces {
		if pod.Namespace == ex {
			return Decision{Reason: "namespace " + ex + " is excluded"}
		}
	}
	podMode, nsMode := pod.Labels[LabelDataplaneMode], ""
	if ns != nil {
		nsMode = ns.Labels[LabelDataplaneMode]
	}
	switch {
	case podMode == ModeAmbient:
	case podMode == ModeNone:
		return Decision{Reason: "pod opted out (" + LabelDataplaneMode + "=none)"}
	case nsMode == ModeAmbient:
	default:
		return Decision{Reason: "neither pod nor namespace has " + LabelDataplaneMode + "=ambient"}
	}
	d := Decision{Enroll: true, Reason: "ambient", Pod: redirect.DefaultPodConfig()}
	d.Pod.DNSCapture = cfg.DNSCapture
	switch pod.Annotations[AnnotationDNSCapture] {
	case "true":
		d.Pod.DNSCapture = true
	case "false":
		d.Pod.DNSCapture = false
	}
	if pod.Annotations[AnnotationBypassInbound] == "true" {
		d.Pod.InboundCapture = false
	}
	if v := pod.Annotations[AnnotationRerouteVirtual]; v != "" {
		for _, i := range strings.Split(v, ",") {
			if i = strings.TrimSpace(i); i != "" {
				d.Pod.RerouteInterfaces = append(d.Pod.RerouteInterfaces, i)
			}
		}
	}
	return d
}

// OutsideMesh returns, sorted, the namespaces none of whose new pods the
// agent would enroll, as far as it can tell: those not labelled
// LabelDataplaneMode=ambient in which no pod of pods (the node's) is
// enrolled by its own label. Excluded namespaces are always outside. A pod
// that opts in by its own label in a namespace with no such pod yet is
// not foreseen: it is enrolled once the agent sees it.
func OutsideMesh(namespaces []*corev1.Namespace, pods []*corev1.Pod, cfg Config) []string {
	optIn := map[string]bool{}
	for _, p := range pods {
		if p.Labels[LabelDataplaneMode] == ModeAmbient {
			optIn[p.Namespace] = true
		}
	}
	var out []string
	for _, ns := range namespaces {
		excluded := slices.Contains(cfg.ExcludedNamespaces, ns.Name)
		if excluded || (ns.Labels[LabelDataplaneMode] != ModeAmbient && !optIn[ns.Name]) {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out
}
