package inject

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}

// traffic is the redirection configuration of a pod: its
// traffic.sidecar.istio.io/* annotations over the defaults (capture every
// outbound address and inbound port; leave the status port alone).
type traffic struct {
	includeOutboundRanges string
	excludeOutboundRanges string
	includeInboundPorts   string
	excludeInboundPorts   string // with the status port
	includeOutboundPorts  *string
	excludeOutboundPorts  *string
	// rerouteInterfaces (istio.io/reroute-virtual-interfaces, else the
	// older kubevirtInterfaces) and excludeInterfaces, when set.
	rerouteInterfaces *string
	excludeInterfaces *string
}

func (p *params) traffic() traffic {
	t := traffic{
		includeOutboundRanges: annotationOr(p.pod, AnnotationIncludeOutboundRanges, "*"),
		excludeOutboundRanges: annotationOr(p.pod, AnnotationExcludeOutboundRanges, ""),
		includeInboundPorts:   annotationOr(p.pod, AnnotationIncludeInboundPorts, "*"),
		excludeInboundPorts:   withPort(p.statusPort, annotationOr(p.pod, AnnotationExcludeInboundPorts, "")),
	}
	if v, ok := p.pod.Annotations[AnnotationIncludeOutboundPorts]; ok {
		t.includeOutboundPorts = &v
	}
	if v, ok := p.pod.Annotations[AnnotationExcludeOutboundPorts]; ok {
		t.excludeOutboundPorts = &v
	}
	if v, ok := p.pod.Annotations[AnnotationRerouteInterfaces]; ok {
		t.rerouteInterfaces = &v
	} else if v, ok := p.pod.Annotations[AnnotationKubevirtInterfaces]; ok {
		t.rerouteInterfaces = &v
	}
	if v, ok := p.pod.Annotations[AnnotationExcludeInterfaces]; ok {
		t.excludeInterfaces = &v
	}
	return t
}

// withPort adds port to the comma-separated list unless it is there or is
// "0".
func withPort(port, list string) string {
	if port == "" || port == "0" {
		return list
	}
	ports := splitList(list)
	if slices.Contains(ports, port) {
		return list
	}
	return strings.Join(append(ports, port), ",")
}

// renderSidecar is the sidecar template: istio-proxy (pilot-agent and
// Envoy), an init container for the traffic redirection, and the volumes
// pilot-agent needs.
func renderSidecar(p *params) (*injection, error) {
	inj := &injection{
		labels:      p.canonicalLabels(true),
		annotations: p.commonAnnotations(),
	}
	inj.labels[LabelTLSMode] = firstNonEmpty(p.pod.Labels[LabelTLSMode], "istio")
	if p.pc.GetProxyMetadata()["ISTIO_META_ENABLE_HBONE"] == "true" {
		inj.labels[LabelTunnel] = firstNonEmpty(p.pod.Labels[LabelTunnel], "http")
	}

	t := p.traffic()
	if p.cfg.CNI {
		// The CNI plugin reads the redirection settings from the pod. The
		// interface annotations it reads are the pod's own, already there.
		a := inj.annotations
		a[AnnotationInterceptionMode] = "REDIRECT"
		if t.includeOutboundRanges != "" {
			a[AnnotationIncludeOutboundRanges] = t.includeOutboundRanges
		}
		if t.excludeOutboundRanges != "" {
			a[AnnotationExcludeOutboundRanges] = t.excludeOutboundRanges
		}
		a[AnnotationIncludeInboundPorts] = t.includeInboundPorts
		a[AnnotationExcludeInboundPorts] = t.excludeInboundPorts
		if t.includeOutboundPorts != nil {
			a[AnnotationIncludeOutboundPorts] = *t.includeOutboundPorts
		}
		if t.excludeOutboundPorts != nil {
			a[AnnotationExcludeOutboundPorts] = *t.excludeOutboundPorts
		}
	}

	inj.initContainers = append(inj.initContainers, p.redirectContainer(t))
	proxy, err := p.sidecarProxy()
	if err != nil {
		return nil, err
	}
	if p.native {
		inj.initContainers = append(inj.initContainers, proxy)
	} else {
		inj.containers = append(inj.containers, proxy)
	}

	inj.volumes = []corev1.Volume{
		emptyDir("workload-socket", ""),
		emptyDir("credential-socket", ""),
		emptyDir("workload-certs", ""),
		emptyDir("istio-envoy", corev1.StorageMediumMemory),
		emptyDir("istio-data", ""),
		podInfoVolume(),
		tokenVolume(),
		configMapVolume("istiod-ca-cert", "istio-ca-root-cert", false),
		configMapVolume("istio-ca-crl", "istio-ca-crl", true),
	}
	return inj, nil
}

// redirectContainer is istio-init, which installs the iptables
// redirection (privileged), or, when a CNI plugin installs it,
// istio-validation, which only checks it (unprivileged).
func (p *params) redirectContainer(t traffic) corev1.Container {
	exclude := "15090,15021"
	if t.excludeInboundPorts != "" {
		exclude += "," + t.excludeInboundPorts
	}
	args := []string{
		"istio-iptables",
		"-p", "15001",
		"-z", "15006",
		"-u", strconv.Itoa(proxyUID),
		"-m", "REDIRECT",
		"-i", t.includeOutboundRanges,
		"-x", t.excludeOutboundRanges,
		"-b", t.includeInboundPorts,
		"-d", exclude,
	}
	if t.includeOutboundPorts != nil {
		args = append(args, "-q", *t.includeOutboundPorts)
	}
	if t.excludeOutboundPorts != nil {
		args = append(args, "-o", *t.excludeOutboundPorts)
	}
	if t.rerouteInterfaces != nil {
		args = append(args, "-k", *t.rerouteInterfaces)
	}
	if t.excludeInterfaces != nil {
		args = append(args, "-c", *t.excludeInterfaces)
	}
	args = append(args, "--log_output_level="+annotationOr(p.pod, AnnotationAgentLogLevel, p.cfg.AgentLogLevel))

	c := corev1.Container{
		Name:            InitContainer,
		Image:           p.image,
		ImagePullPolicy: p.cfg.ImagePullPolicy,
		Env:             p.metadataEnv(),
		Resources:       p.resources(),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			Capabilities: &corev1.Capabilities{
				Add:  []corev1.Capability{"NET_ADMIN", "NET_RAW"},
				Drop: []corev1.Capability{"ALL"},
			},
			ReadOnlyRootFilesystem: ptr.To(false),
			RunAsGroup:             ptr.To[int64](0),
			RunAsNonRoot:           ptr.To(false),
			RunAsUser:              ptr.To[int64](0),
		},
	}
	if p.cfg.CNI {
		c.Name = ValidationContainer
		args = append(args, "--run-validation", "--skip-rule-apply")
		c.SecurityContext.Capabilities.Add = nil
		c.SecurityContext.ReadOnlyRootFilesystem = ptr.To(true)
		c.SecurityContext.RunAsGroup = ptr.To[int64](proxyUID)
		c.SecurityContext.RunAsNonRoot = ptr.To(true)
		c.SecurityContext.RunAsUser = ptr.To[int64](proxyUID)
	}
	c.Args = args
	return c
}

// sidecarProxy is istio-proxy of the sidecar template.
func (p *params) sidecarProxy() (corev1.Container, error) {
	env, err := p.identityEnv(true)
	if err != nil {
		return corev1.Container{}, err
	}
	c := corev1.Container{
		Name:            ProxyContainer,
		Image:           p.image,
		ImagePullPolicy: p.cfg.ImagePullPolicy,
		Ports:           []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: envoyPromPort, Protocol: corev1.ProtocolTCP}},
		Args:            p.proxyArgs(),
		Env:             env,
		Resources:       p.resources(),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			Privileged:               ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](proxyUID),
			RunAsGroup:               ptr.To[int64](proxyUID),
		},
		VolumeMounts: []corev1.VolumeMount{
			mount("workload-socket", "/var/run/secrets/workload-spiffe-uds"),
			mount("credential-socket", "/var/run/secrets/credential-uds"),
			mount("workload-certs", "/var/run/secrets/workload-spiffe-credentials"),
			mount("istiod-ca-cert", "/var/run/secrets/istio"),
			mount("istio-ca-crl", "/var/run/secrets/istio/crl"),
			mount("istio-data", "/var/lib/istio/data"),
			mount("istio-envoy", "/etc/istio/proxy"),
			mount("istio-token", "/var/run/secrets/tokens"),
			mount("istio-podinfo", "/etc/istio/pod"),
		},
	}
	if p.native {
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	}
	switch {
	case p.hold:
		c.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{"pilot-agent", "wait"}},
		}}
	case p.native:
		// Drain when the pod starts shutting down; SIGTERM comes once
		// the applications are gone.
		c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{
				"pilot-agent", "request", "--debug-port=" + p.statusPort, "POST", "drain",
			}},
		}}
	}
	if p.statusPort != "0" {
		c.StartupProbe = &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz/ready",
				Port: intstr.FromInt32(readinessPort),
			}},
			InitialDelaySeconds: 0,
			PeriodSeconds:       1,
			TimeoutSeconds:      3,
			FailureThreshold:    600,
		}
		c.ReadinessProbe = p.readinessProbe(readinessPort)
	}
	return c, nil
}
