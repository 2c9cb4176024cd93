package inject

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Labels, annotations, and names of what the injector adds, as Istio's
// injector spells them.
const (
	LabelInject        = "sidecar.istio.io/inject"
	LabelRev           = "istio.io/rev"
	LabelInjection     = "istio-injection"
	LabelDataplaneMode = "istio.io/dataplane-mode"
	LabelTLSMode       = "security.istio.io/tlsMode"
	LabelTunnel        = "networking.istio.io/tunnel"
	LabelCanonicalName = "service.istio.io/canonical-name"
	LabelCanonicalRev  = "service.istio.io/canonical-revision"
	LabelWorkloadName  = "service.istio.io/workload-name"
	LabelNetwork       = "topology.istio.io/network"

	AnnotationStatus                = "sidecar.istio.io/status"
	AnnotationInject                = "sidecar.istio.io/inject"
	AnnotationTemplates             = "inject.istio.io/templates"
	AnnotationRev                   = "istio.io/rev"
	AnnotationDefaultContainer      = "kubectl.kubernetes.io/default-container"
	AnnotationDefaultLogsContainer  = "kubectl.kubernetes.io/default-logs-container"
	AnnotationProxyImage            = "sidecar.istio.io/proxyImage"
	AnnotationProxyImageType        = "sidecar.istio.io/proxyImageType"
	AnnotationProxyCPU              = "sidecar.istio.io/proxyCPU"
	AnnotationProxyMemory           = "sidecar.istio.io/proxyMemory"
	AnnotationProxyCPULimit         = "sidecar.istio.io/proxyCPULimit"
	AnnotationProxyMemoryLimit      = "sidecar.istio.io/proxyMemoryLimit"
	AnnotationLogLevel              = "sidecar.istio.io/logLevel"
	AnnotationComponentLogLevel     = "sidecar.istio.io/componentLogLevel"
	AnnotationAgentLogLevel         = "sidecar.istio.io/agentLogLevel"
	AnnotationStatusPort            = "status.sidecar.istio.io/port"
	AnnotationReadinessInitialDelay = "readiness.status.sidecar.istio.io/initialDelaySeconds"
	AnnotationReadinessPeriod       = "readiness.status.sidecar.istio.io/periodSeconds"
	AnnotationReadinessFailure      = "readiness.status.sidecar.istio.io/failureThreshold"
	AnnotationRewriteProbes         = "sidecar.istio.io/rewriteAppHTTPProbers"
	AnnotationProxyConfig           = "proxy.istio.io/config"
	AnnotationNativeSidecar         = "sidecar.istio.io/nativeSidecar"
	AnnotationInterceptionMode      = "sidecar.istio.io/interceptionMode"
	AnnotationIncludeOutboundRanges = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutboundRanges = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationIncludeInboundPorts   = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationExcludeInboundPorts   = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationIncludeOutboundPorts  = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeOutboundPorts  = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeInterfaces     = "traffic.sidecar.istio.io/excludeInterfaces"
	AnnotationKubevirtInterfaces    = "traffic.sidecar.istio.io/kubevirtInterfaces"
	AnnotationRerouteInterfaces     = "istio.io/reroute-virtual-interfaces"

	// ProxyContainer is the injected proxy's container name.
	ProxyContainer = "istio-proxy"
	// InitContainer sets up iptables redirection (without CNI).
	InitContainer = "istio-init"
	// ValidationContainer checks the CNI plugin's redirection (with CNI).
	ValidationContainer = "istio-validation"

	// TemplateSidecar is the default template: Envoy plus pilot-agent.
	TemplateSidecar = "sidecar"
	// TemplateGRPCAgent is proxyless gRPC: pilot-agent without Envoy.
	TemplateGRPCAgent = "grpc-agent"
)

// ErrUnknownTemplate is returned for an inject.istio.io/templates value
// that names a template Canopy does not have.
var ErrUnknownTemplate = errors.New("unknown injection template")

// RefusedError says that a pod carries an annotation Canopy's injector
// does not honour. Injecting such a pod would silently drop what the
// annotation asks for, so the webhook denies it with this message instead.
type RefusedError struct {
	Annotation string
	Value      string
	Reason     string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("annotation %s=%q is not supported by Canopy's sidecar injector: %s (remove it, or see docs/sidecar-injection.md)",
		e.Annotation, e.Value, e.Reason)
}

// refusal is an annotation Canopy does not honour; ok, when set, lists the
// values that ask for nothing Canopy lacks.
type refusal struct {
	name   string
	ok     func(string) bool
	reason string
}

// refusedAnnotations is the list in the package documentation.
func refusedAnnotations() []refusal {
	return []refusal{
		{name: "sidecar.istio.io/bootstrapOverride", reason: "custom Envoy bootstrap ConfigMaps are not mounted"},
		{name: "sidecar.istio.io/userVolume", reason: "extra volumes are not added"},
		{name: "sidecar.istio.io/userVolumeMount", reason: "extra volume mounts are not added to istio-proxy"},
		{name: "proxy.istio.io/overrides", reason: "user overrides of the injected containers are not merged"},
		{name: "sidecar.istio.io/capNetBindService", reason: "istio-proxy never runs as root or with NET_BIND_SERVICE"},
		{name: "sidecar.istio.io/enableCoreDump", reason: "no core-dump init container is added"},
		{
			name:   "prometheus.istio.io/merge-metrics",
			ok:     func(v string) bool { b, err := strconv.ParseBool(v); return err == nil && !b },
			reason: "application metrics are not merged into pilot-agent's; only \"false\" is accepted",
		},
		{
			name:   AnnotationInterceptionMode,
			ok:     func(v string) bool { return v == "REDIRECT" },
			reason: "only REDIRECT interception is supported",
		},
	}
}

// checkAnnotations refuses a pod carrying an annotation Canopy does not
// honour and validates the values of those it does, as Istio's injector
// validates them.
func checkAnnotations(annos map[string]string) error {
	for _, r := range refusedAnnotations() {
		v, ok := annos[r.name]
		if !ok || (r.ok != nil && r.ok(v)) {
			continue
		}
		return &RefusedError{Annotation: r.name, Value: v, Reason: r.reason}
	}
	checks := []struct {
		name  string
		check func(string) error
	}{
		{AnnotationProxyCPU, checkQuantity},
		{AnnotationProxyMemory, checkQuantity},
		{AnnotationProxyCPULimit, checkQuantity},
		{AnnotationProxyMemoryLimit, checkQuantity},
		{AnnotationStatusPort, checkStatusPort},
		{AnnotationReadinessInitialDelay, checkUint32},
		{AnnotationReadinessPeriod, checkUint32},
		{AnnotationReadinessFailure, checkUint32},
		{AnnotationIncludeOutboundRanges, func(v string) error { return checkCIDRs(v, true) }},
		{AnnotationExcludeOutboundRanges, func(v string) error { return checkCIDRs(v, false) }},
		{AnnotationIncludeInboundPorts, func(v string) error { return checkPorts(v, true) }},
		{AnnotationExcludeInboundPorts, func(v string) error { return checkPorts(v, false) }},
		{AnnotationIncludeOutboundPorts, func(v string) error { return checkPorts(v, false) }},
		{AnnotationExcludeOutboundPorts, func(v string) error { return checkPorts(v, false) }},
		{AnnotationExcludeInterfaces, checkInterfaces},
		{AnnotationKubevirtInterfaces, checkInterfaces},
		{AnnotationRerouteInterfaces, checkInterfaces},
		{AnnotationLogLevel, checkArg},
		{AnnotationComponentLogLevel, checkArg},
		{AnnotationAgentLogLevel, checkArg},
		{AnnotationProxyImage, checkArg},
		{AnnotationProxyImageType, checkArg},
	}
	for _, c := range checks {
		v, ok := annos[c.name]
		if !ok {
			continue
		}
		if err := c.check(v); err != nil {
			return fmt.Errorf("annotation %s=%q: %w", c.name, v, err)
		}
	}
	return nil
}

func checkQuantity(v string) error {
	if _, err := resource.ParseQuantity(v); err != nil {
		return fmt.Errorf("not a resource quantity: %w", err)
	}
	return nil
}

func checkStatusPort(v string) error {
	if _, err := strconv.ParseUint(v, 10, 16); err != nil {
		return fmt.Errorf("not a port (0 turns the status port off): %w", err)
	}
	return nil
}

func checkUint32(v string) error {
	if _, err := strconv.ParseUint(v, 10, 31); err != nil {
		return fmt.Errorf("not a non-negative integer: %w", err)
	}
	return nil
}

// checkCIDRs accepts a comma-separated list of CIDRs, or "*" when
// wildcard.
func checkCIDRs(v string, wildcard bool) error {
	if wildcard && v == "*" {
		return nil
	}
	for _, s := range splitList(v) {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("not a list of CIDRs: %w", err)
		}
	}
	return nil
}

// checkPorts accepts a comma-separated list of ports, or "*" when
// wildcard.
func checkPorts(v string, wildcard bool) error {
	if wildcard && v == "*" {
		return nil
	}
	for _, s := range splitList(v) {
		if _, err := strconv.ParseUint(s, 10, 16); err != nil {
			return fmt.Errorf("%q is not a port", s)
		}
	}
	return nil
}

// checkInterfaces accepts a comma-separated list of interface names, as
// Istio's injector does: no empty entry, each 1 to 15 bytes, a letter
// first, then letters, digits, '_', '.' and '-'. They become arguments of
// istio-init, or rules the CNI plugin writes.
func checkInterfaces(v string) error {
	if v == "" {
		return nil
	}
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" || len(name) > 15 {
			return fmt.Errorf("interface name %q: want 1 to 15 bytes", name)
		}
		for i, r := range name {
			letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
			if !letter && (i == 0 || !((r >= '0' && r <= '9') || r == '_' || r == '.' || r == '-')) {
				return fmt.Errorf("interface name %q: want a letter, then letters, digits, '_', '.' or '-'", name)
			}
		}
	}
	return nil
}

// checkArg keeps values that end up as one command-line argument or an
// image name from carrying line breaks or NULs.
func checkArg(v string) error {
	if strings.ContainsAny(v, "\x00\n\r") {
		return errors.New("contains a control character")
	}
	return nil
}

// splitList splits a comma-separated list, trimming spaces and dropping
// empty entries.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// annotationOr is the pod's annotation name if present (even empty), else
// def: the annotation function of Istio's templates.
func annotationOr(pod *corev1.Pod, name, def string) string {
	if v, ok := pod.Annotations[name]; ok {
		return v
	}
	return def
}
