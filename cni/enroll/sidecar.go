package enroll

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/cni/redirect"
)

// What a sidecar-injected pod carries: the injector's names, read here as
// the sidecar's CNI plugin reads them.
const (
	// LabelInject and AnnotationInject say "false" for a pod that must
	// not get a sidecar; the label wins over the annotation.
	LabelInject      = "sidecar.istio.io/inject"
	AnnotationInject = "sidecar.istio.io/inject"

	AnnotationInterceptionMode      = "sidecar.istio.io/interceptionMode"
	AnnotationStatusPort            = "status.sidecar.istio.io/port"
	AnnotationIncludeOutboundRanges = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutboundRanges = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationIncludeInboundPorts   = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationExcludeInboundPorts   = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationIncludeOutboundPorts  = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeOutboundPorts  = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeInterfaces     = "traffic.sidecar.istio.io/excludeInterfaces"
	// AnnotationKubevirtInterfaces is the older name of
	// AnnotationRerouteVirtual, read only when that one is absent.
	AnnotationKubevirtInterfaces = "traffic.sidecar.istio.io/kubevirtInterfaces"

	// ContainerProxy is the injected proxy; ContainerInit the init
	// container that installs the capture itself when no CNI plugin does.
	ContainerProxy = "istio-proxy"
	ContainerInit  = "istio-init"

	// Environment of istio-proxy that the capture depends on.
	EnvDisableEnvoy = "DISABLE_ENVOY"
	EnvDNSCapture   = "ISTIO_META_DNS_CAPTURE"
	EnvInvalidDrop  = "INVALID_DROP"

	InterceptionRedirect = "REDIRECT"
	InterceptionTProxy   = "TPROXY"
)

// ErrUnsupported is a capture setting Canopy does not install: the pod is
// refused rather than started with less capture than it asked for.
var ErrUnsupported = errors.New("not supported by canopy-cni-agent")

// sidecarPod reports whether pod gets the sidecar capture from the agent,
// and if not why: it has istio-proxy, an Envoy in it, and the injector's
// status, and it does not install its own capture (istio-init).
func sidecarPod(pod *corev1.Pod) (bool, string) {
	all := allContainers(pod)
	proxy := -1
	for i, c := range all {
		switch c.Name {
		case ContainerInit:
			return false, "pod has " + ContainerInit + ", which installs its own capture"
		case ContainerProxy:
			if proxy < 0 {
				proxy = i
			}
		}
	}
	if proxy < 0 {
		return false, "pod has a sidecar status but no " + ContainerProxy + " container"
	}
	c := all[proxy]
	// Proxyless gRPC: pilot-agent without Envoy. Nothing would listen on
	// 15001 or 15006, so capture would only cut the pod off.
	if v, ok := env(c, EnvDisableEnvoy); ok {
		if off, err := strconv.ParseBool(v); err == nil && off {
			return false, "proxyless pod (" + EnvDisableEnvoy + " on " + ContainerProxy + "): no Envoy to capture for"
		}
	}
	if len(c.Args) >= 2 && c.Args[0] == "proxy" && c.Args[1] != "sidecar" {
		return false, "proxy of type " + c.Args[1] + ", not a sidecar"
	}
	v, ok := pod.Labels[LabelInject]
	if !ok {
		v = pod.Annotations[AnnotationInject]
	}
	if on, err := strconv.ParseBool(v); err == nil && !on {
		return false, "pod refuses a sidecar (" + LabelInject + "=false)"
	}
	return true, ""
}

func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
}

func proxyContainer(pod *corev1.Pod) *corev1.Container {
	for _, c := range allContainers(pod) {
		if c.Name == ContainerProxy {
			return &c
		}
	}
	return nil
}

// env is a container's literal value of name (a value taken from
// elsewhere reads as empty).
func env(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// SidecarCapture reads the capture a sidecar pod asks for: its
// traffic.sidecar.istio.io/* annotations (an absent one means the
// default, a present but empty one an empty list), its interception mode
// and status port, and istio-proxy's UID, GID and environment. Lists are
// comma-separated; spaces around entries and empty entries are ignored,
// as the injector ignores them. A malformed value is an error naming the
// annotation: the pod must not start with other capture than it asked for.
func SidecarCapture(pod *corev1.Pod) (*redirect.SidecarConfig, error) {
	a := pod.Annotations
	c := redirect.DefaultSidecarConfig()
	switch mode, ok := a[AnnotationInterceptionMode]; {
	case !ok || mode == InterceptionRedirect:
	case mode == InterceptionTProxy:
		return nil, fmt.Errorf("annotation %s=%q: %w (only %s)", AnnotationInterceptionMode, mode, ErrUnsupported, InterceptionRedirect)
	default:
		return nil, fmt.Errorf("annotation %s=%q: unknown interception mode (want %s)", AnnotationInterceptionMode, mode, InterceptionRedirect)
	}

	var err error
	if v, ok := a[AnnotationIncludeOutboundRanges]; ok {
		if c.IncludeOutbound, err = parseRanges(v); err != nil {
			return nil, annotationError(AnnotationIncludeOutboundRanges, v, err)
		}
	}
	if v, ok := a[AnnotationExcludeOutboundRanges]; ok {
		if c.ExcludeOutbound, err = parsePrefixes(v); err != nil {
			return nil, annotationError(AnnotationExcludeOutboundRanges, v, err)
		}
	}
	if v, ok := a[AnnotationIncludeInboundPorts]; ok {
		if c.IncludeInbound, err = parsePortSet(v); err != nil {
			return nil, annotationError(AnnotationIncludeInboundPorts, v, err)
		}
	}
	for _, l := range []struct {
		name string
		dst  *[]uint16
	}{
		{AnnotationExcludeInboundPorts, &c.ExcludeInboundPorts},
		{AnnotationIncludeOutboundPorts, &c.IncludeOutboundPorts},
		{AnnotationExcludeOutboundPorts, &c.ExcludeOutboundPorts},
	} {
		if v, ok := a[l.name]; ok {
			if *l.dst, err = parsePorts(v); err != nil {
				return nil, annotationError(l.name, v, err)
			}
		}
	}
	if v, ok := a[AnnotationStatusPort]; ok {
		p, err := parsePort(v)
		if err != nil {
			return nil, annotationError(AnnotationStatusPort, v, err)
		}
		// 0 turns the status port off: nothing to leave alone. The
		// injector lists it among the excluded ports already.
		if p != 0 && !slices.Contains(c.ExcludeInboundPorts, p) {
			c.ExcludeInboundPorts = append(c.ExcludeInboundPorts, p)
		}
	}
	reroute := AnnotationRerouteVirtual
	if _, ok := a[reroute]; !ok {
		reroute = AnnotationKubevirtInterfaces
	}
	for _, l := range []struct {
		name string
		dst  *[]string
	}{{reroute, &c.RerouteInterfaces}, {AnnotationExcludeInterfaces, &c.ExcludeInterfaces}} {
		if v, ok := a[l.name]; ok {
			if *l.dst, err = parseInterfaces(v); err != nil {
				return nil, annotationError(l.name, v, err)
			}
		}
	}

	if p := proxyContainer(pod); p != nil {
		if sc := p.SecurityContext; sc != nil {
			// Unset or 0 (root is never the proxy) keeps the default.
			for _, id := range []struct {
				v    *int64
				dst  *uint32
				what string
			}{{sc.RunAsUser, &c.ProxyUID, "runAsUser"}, {sc.RunAsGroup, &c.ProxyGID, "runAsGroup"}} {
				if id.v == nil || *id.v == 0 {
					continue
				}
				if *id.v < 0 || *id.v > math.MaxUint32 {
					return nil, fmt.Errorf("%s %s %d: out of range", ContainerProxy, id.what, *id.v)
				}
				*id.dst = uint32(*id.v)
			}
		}
		for _, e := range []struct {
			name string
			dst  *bool
		}{{EnvDNSCapture, &c.DNSCapture}, {EnvInvalidDrop, &c.DropInvalid}} {
			if v, ok := env(*p, e.name); ok && v != "" {
				b, err := strconv.ParseBool(v)
				if err != nil {
					return nil, fmt.Errorf("%s environment %s=%q: not a boolean", ContainerProxy, e.name, v)
				}
				*e.dst = b
			}
		}
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("sidecar capture: %w", err)
	}
	return c, nil
}

func annotationError(name, value string, err error) error {
	return fmt.Errorf("annotation %s=%q: %w", name, value, err)
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

// parseRanges reads "*" (every address) or a list of CIDRs.
func parseRanges(v string) (redirect.Ranges, error) {
	if strings.TrimSpace(v) == "*" {
		return redirect.Ranges{All: true}, nil
	}
	ps, err := parsePrefixes(v)
	return redirect.Ranges{Prefixes: ps}, err
}

// parsePrefixes reads a list of CIDRs. An address with host bits set is
// taken as its network, as the kernel would.
func parsePrefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range splitList(v) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("not a CIDR: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parsePortSet reads "*" (every port) or a list of ports.
func parsePortSet(v string) (redirect.Ports, error) {
	if strings.TrimSpace(v) == "*" {
		return redirect.Ports{All: true}, nil
	}
	ps, err := parsePorts(v)
	return redirect.Ports{Ports: ps}, err
}

// parsePorts reads a list of ports. Port 0, which no connection uses, is
// accepted (the injector accepts it) and left out.
func parsePorts(v string) ([]uint16, error) {
	var out []uint16
	for _, s := range splitList(v) {
		p, err := parsePort(s)
		if err != nil {
			return nil, err
		}
		if p != 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

func parsePort(s string) (uint16, error) {
	p, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port (0 to 65535)", s)
	}
	return uint16(p), nil
}

// parseInterfaces reads a list of interface names.
func parseInterfaces(v string) ([]string, error) {
	out := splitList(v)
	for _, i := range out {
		if err := redirect.ValidateInterfaceName(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}
