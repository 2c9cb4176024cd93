// Package enroll decides which pods the CNI agent puts in the mesh
// (docs/wire-contract.md §4.5) and with which per-pod redirection settings
// (docs/wire-contract.md §4.2): ambient pods, and sidecar-injected pods
// whose capture the agent installs in place of their init container
// (sidecar.go). It is pure: Kubernetes objects in, a decision out.
package enroll

import (
	"fmt"
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
	// SidecarCapture installs the capture of sidecar-injected pods (those
	// injected for a CNI plugin, without istio-init). Off, they are left
	// alone, as are all pods with a sidecar.
	SidecarCapture bool
}

// Decision is whether a pod is in the mesh, and why.
type Decision struct {
	Enroll bool
	// Reason says why, for logs, events and the pod's condition.
	Reason string
	// Sidecar is set for a sidecar pod, even one whose settings fail.
	Sidecar bool
	// Pod is the redirection to install; Pod.Sidecar is set for a sidecar
	// pod.
	Pod redirect.PodConfig
}

// Decide applies the enablement selector: the pod's label, else its
// namespace's; host-network, node-proxy and excluded pods are never
// enrolled. A pod with a sidecar is never an ambient pod: with
// SidecarCapture it gets its sidecar capture, if it is a pod the agent
// captures for (sidecarPod). ns may be nil when the namespace is unknown.
//
// An error is a pod that belongs in the mesh but whose settings are
// malformed or unsupported: its Decision says Enroll, without a
// configuration, and the pod must not run.
func Decide(pod *corev1.Pod, ns *corev1.Namespace, cfg Config) (Decision, error) {
	switch {
	case pod.Spec.HostNetwork:
		return Decision{Reason: "host-network pod"}, nil
	case pod.Namespace == cfg.SystemNamespace && pod.Labels["app"] == "ztunnel":
		return Decision{Reason: "node proxy pod"}, nil
	}
	for _, ex := range cfg.ExcludedNamespaces {
		if pod.Namespace == ex {
			return Decision{Reason: "namespace " + ex + " is excluded"}, nil
		}
	}
	if pod.Annotations[AnnotationSidecarStatus] != "" {
		return decideSidecar(pod, cfg)
	}
	d := decideAmbient(pod, ns, cfg)
	if d.Enroll {
		if err := checkPortSysctls(pod); err != nil {
			return Decision{Enroll: true, Reason: d.Reason}, err
		}
	}
	return d, nil
}

// The pod sysctls (Kubernetes' safe sysctls, in the pod's
// securityContext) that decide which ports the kernel picks by itself.
const (
	SysctlPortRange     = "net.ipv4.ip_local_port_range"
	SysctlReservedPorts = "net.ipv4.ip_local_reserved_ports"
)

// checkPortSysctls refuses an ambient pod whose sysctls would let the
// kernel give a process of the pod one of the node proxy's ports: the
// agent reserves them in the pod's namespace when it enrolls it (the
// kernel's own choice of a port never runs the bind guard,
// redirect.PortGuard), but the container runtime writes the pod's
// sysctls when it starts the sandbox, after the CNI ADD, and a
// net.ipv4.ip_local_reserved_ports of the pod's replaces the agent's. A
// pod that sets only its port range keeps the agent's reservation.
func checkPortSysctls(pod *corev1.Pod) error {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	var ports, reserved string
	replaced := false
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		// Kubernetes takes slashes for dots too.
		switch strings.ReplaceAll(s.Name, "/", ".") {
		case SysctlPortRange:
			ports = s.Value
		case SysctlReservedPorts:
			reserved, replaced = s.Value, true
		}
	}
	if !replaced {
		return nil
	}
	if ports == "" {
		ports = redirect.DefaultPortRange
	}
	open, err := redirect.AutoboundGuardedPorts(ports, reserved)
	if err != nil {
		return fmt.Errorf("pod sysctls %s, %s: %w", SysctlPortRange, SysctlReservedPorts, err)
	}
	if len(open) > 0 {
		return fmt.Errorf("pod sysctl %s=%q replaces the node proxy's reserved ports and leaves %v, in the port range %q, to the kernel's choice, "+
			"which could give a process of the pod the proxy's port: reserve them too: %w", SysctlReservedPorts, reserved, open, ports, ErrUnsupported)
	}
	return nil
}

// ReasonSidecar is the reason of a sidecar pod's enrollment.
const ReasonSidecar = "sidecar"

func decideSidecar(pod *corev1.Pod, cfg Config) (Decision, error) {
	if !cfg.SidecarCapture {
		return Decision{Reason: "pod has a sidecar"}, nil
	}
	if ok, why := sidecarPod(pod); !ok {
		return Decision{Reason: why}, nil
	}
	c, err := SidecarCapture(pod)
	if err != nil {
		return Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true}, err
	}
	return Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true, Pod: redirect.PodConfig{Sidecar: c}}, nil
}

func decideAmbient(pod *corev1.Pod, ns *corev1.Namespace, cfg Config) Decision {
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

// Namespace labels that select a namespace's pods for sidecar injection.
const (
	LabelInjection = "istio-injection"
	LabelRev       = "istio.io/rev"
)

// OutsideMesh returns, sorted, the namespaces none of whose new pods the
// agent would enroll, as far as it can tell: those not labelled
// LabelDataplaneMode=ambient in which no pod of pods (the node's) is
// enrolled by its own label. Excluded namespaces are always outside. A pod
// that opts in by its own label in a namespace with no such pod yet is
// not foreseen: it is enrolled once the agent sees it.
//
// With SidecarCapture, a namespace whose pods may be injected (labelled
// istio-injection=enabled, or with any istio.io/rev) is inside too, as is
// one with a sidecar pod of the node the agent captures for. The first
// injected pod of a namespace without those, injected by its own label,
// is not foreseen; its istio-validation init container then fails until
// the agent is back and installs its capture.
func OutsideMesh(namespaces []*corev1.Namespace, pods []*corev1.Pod, cfg Config) []string {
	optIn := map[string]bool{}
	for _, p := range pods {
		if p.Labels[LabelDataplaneMode] == ModeAmbient {
			optIn[p.Namespace] = true
		}
		if cfg.SidecarCapture && p.Annotations[AnnotationSidecarStatus] != "" {
			if ok, _ := sidecarPod(p); ok {
				optIn[p.Namespace] = true
			}
		}
	}
	var out []string
	for _, ns := range namespaces {
		excluded := slices.Contains(cfg.ExcludedNamespaces, ns.Name)
		_, rev := ns.Labels[LabelRev]
		injected := cfg.SidecarCapture && (ns.Labels[LabelInjection] == "enabled" || rev)
		if excluded || (ns.Labels[LabelDataplaneMode] != ModeAmbient && !optIn[ns.Name] && !injected) {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out
}
