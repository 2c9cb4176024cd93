package inject

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	meshapi "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Ports and paths of the injected proxy.
const (
	defaultStatusPort = "15020" // pilot-agent: app probes, merged metrics
	readinessPort     = 15021   // Envoy's /healthz/ready
	envoyPromPort     = 15090
	proxyUID          = 1337
)

// params is everything a template reads: the pod as it came, the
// configuration, and what was derived from both.
type params struct {
	cfg  Config
	pod  *corev1.Pod // never modified
	pc   *meshapi.ProxyConfig
	pcJS string
	// image is the proxyv2 image, after sidecar.istio.io/proxyImage[Type].
	image string
	// statusPort is pilot-agent's status port, "0" for none.
	statusPort string
	native     bool
	hold       bool
	// network is ISTIO_META_NETWORK: the pod's topology.istio.io/network
	// label when not empty, else the configured network.
	network string
	deploy  deployMeta
	// apps are the names of the pod's containers (not init containers).
	apps []string
}

// injection is what a template adds to a pod. Labels and annotations are
// set; containers and volumes are added (their names must be new); appEnv
// and appMounts are set on every application container.
type injection struct {
	labels         map[string]string
	annotations    map[string]string
	initContainers []corev1.Container
	containers     []corev1.Container
	volumes        []corev1.Volume
	appEnv         []corev1.EnvVar
	appMounts      []corev1.VolumeMount
}

// deployMeta is the workload a pod belongs to, found from its controller
// as Istio's injector finds it: the Deployment of a ReplicaSet's pod, the
// CronJob of a Job's, and so on; else the pod itself.
type deployMeta struct {
	name, namespace, kind, apiVersion string
}

func podDeployMeta(pod *corev1.Pod) deployMeta {
	d := deployMeta{name: pod.Name, namespace: pod.Namespace, kind: "Pod", apiVersion: "v1"}
	if pod.GenerateName == "" {
		return d
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return d
	}
	d.kind, d.apiVersion, d.name = ref.Kind, ref.APIVersion, ref.Name
	hash, rollout := pod.Labels["pod-template-hash"], pod.Labels["rollouts-pod-template-hash"]
	switch {
	case ref.Kind == "ReplicaSet" && hash != "" && strings.HasSuffix(ref.Name, hash):
		d.name, d.kind = strings.TrimSuffix(ref.Name, "-"+hash), "Deployment"
	case ref.Kind == "ReplicaSet" && rollout != "" && strings.HasSuffix(ref.Name, rollout):
		d.name, d.kind, d.apiVersion = strings.TrimSuffix(ref.Name, "-"+rollout), "Rollout", "v1alpha1"
	case ref.Kind == "ReplicationController" && pod.Labels["deploymentconfig"] != "":
		d.name, d.kind = pod.Labels["deploymentconfig"], "DeploymentConfig"
	case ref.Kind == "Job":
		if i := strings.LastIndexByte(ref.Name, '-'); i > 0 && isDigits(ref.Name[i+1:], 8, 10) {
			d.name, d.kind, d.apiVersion = ref.Name[:i], "CronJob", "batch/v1"
		}
	}
	return d
}

func isDigits(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// firstNonEmpty is the first non-empty value: the default chain of
// Istio's templates, where an empty label counts as absent.
func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// canonicalLabels are service.istio.io/canonical-name and -revision.
func (p *params) canonicalLabels(trim bool) map[string]string {
	l := p.pod.Labels
	name := firstNonEmpty(l[LabelCanonicalName], l["app.kubernetes.io/name"], l["app"], p.deploy.name)
	if trim {
		if len(name) > 63 {
			name = name[:63]
		}
		name = strings.Trim(name, "-_.")
	}
	return map[string]string{
		LabelCanonicalName: name,
		LabelCanonicalRev:  firstNonEmpty(l[LabelCanonicalRev], l["app.kubernetes.io/version"], l["version"], "latest"),
	}
}

// commonAnnotations are istio.io/rev and kubectl's default containers.
func (p *params) commonAnnotations() map[string]string {
	a := map[string]string{AnnotationRev: p.cfg.revisionName()}
	if len(p.apps) > 0 {
		for _, k := range []string{AnnotationDefaultLogsContainer, AnnotationDefaultContainer} {
			if _, ok := p.pod.Annotations[k]; !ok {
				a[k] = p.apps[0]
			}
		}
	}
	return a
}

// proxyArgs are pilot-agent's arguments.
func (p *params) proxyArgs() []string {
	return []string{
		"proxy",
		"sidecar",
		"--domain",
		"$(POD_NAMESPACE).svc." + p.cfg.ClusterDomain,
		"--proxyLogLevel=" + annotationOr(p.pod, AnnotationLogLevel, p.cfg.ProxyLogLevel),
		"--proxyComponentLogLevel=" + annotationOr(p.pod, AnnotationComponentLogLevel, p.cfg.ProxyComponentLogLevel),
		"--log_output_level=" + annotationOr(p.pod, AnnotationAgentLogLevel, p.cfg.AgentLogLevel),
	}
}

// resources are istio-proxy's requests and limits: from the
// sidecar.istio.io/proxyCPU… annotations when any is set, else the
// configured defaults. Values were validated by checkAnnotations.
func (p *params) resources() corev1.ResourceRequirements {
	a := p.pod.Annotations
	cpu, hasCPU := a[AnnotationProxyCPU]
	mem, hasMem := a[AnnotationProxyMemory]
	cpuLim, hasCPULim := a[AnnotationProxyCPULimit]
	memLim, hasMemLim := a[AnnotationProxyMemoryLimit]
	if !hasCPU && !hasMem && !hasCPULim && !hasMemLim {
		return *p.cfg.ProxyResources.DeepCopy()
	}
	var r corev1.ResourceRequirements
	set := func(l *corev1.ResourceList, name corev1.ResourceName, v string, ok bool) {
		if !ok {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[name] = resource.MustParse(v)
	}
	set(&r.Requests, corev1.ResourceCPU, cpu, hasCPU)
	set(&r.Requests, corev1.ResourceMemory, mem, hasMem)
	set(&r.Limits, corev1.ResourceCPU, cpuLim, hasCPULim)
	set(&r.Limits, corev1.ResourceMemory, memLim, hasMemLim)
	return r
}

// readinessProbe is istio-proxy's readiness probe on port, with the
// readiness.status.sidecar.istio.io/* annotations (defaults 0 s delay,
// 15 s period, 4 failures).
func (p *params) readinessProbe(port int32) *corev1.Probe {
	num := func(name string, def int32) int32 {
		v, err := strconv.ParseInt(annotationOr(p.pod, name, ""), 10, 32)
		if err != nil {
			return def
		}
		return int32(v)
	}
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz/ready",
			Port: intstr.FromInt32(port),
		}},
		InitialDelaySeconds: num(AnnotationReadinessInitialDelay, 0),
		PeriodSeconds:       num(AnnotationReadinessPeriod, 15),
		TimeoutSeconds:      3,
		FailureThreshold:    num(AnnotationReadinessFailure, 4),
	}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: path},
	}}
}

func resourceEnv(name, res string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: res, Divisor: resource.MustParse("1")},
	}}
}

func valueEnv(name, value string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, Value: value}
}

// podPorts is ISTIO_META_POD_PORTS: the ports of the pod's containers as
// JSON.
func (p *params) podPorts() (string, error) {
	ports := []corev1.ContainerPort{}
	for _, c := range p.pod.Spec.Containers {
		ports = append(ports, c.Ports...)
	}
	b, err := json.Marshal(ports)
	if err != nil {
		return "", fmt.Errorf("marshal pod ports: %w", err)
	}
	return string(b), nil
}

// identityEnv is the environment both templates give pilot-agent, from
// PILOT_CERT_PROVIDER to TRUST_DOMAIN, with the extras of the sidecar
// template (CPU and memory limits, interception mode) when sidecar is set.
func (p *params) identityEnv(sidecar bool) ([]corev1.EnvVar, error) {
	ports, err := p.podPorts()
	if err != nil {
		return nil, err
	}
	env := []corev1.EnvVar{
		valueEnv("PILOT_CERT_PROVIDER", "istiod"),
		valueEnv("CA_ADDR", p.cfg.CAAddress),
		fieldEnv("POD_NAME", "metadata.name"),
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("INSTANCE_IP", "status.podIP"),
		fieldEnv("SERVICE_ACCOUNT", "spec.serviceAccountName"),
		fieldEnv("HOST_IP", "status.hostIP"),
	}
	if sidecar {
		env = append(env, resourceEnv("ISTIO_CPU_LIMIT", "limits.cpu"))
	}
	env = append(env,
		valueEnv("PROXY_CONFIG", p.pcJS),
		valueEnv("ISTIO_META_POD_PORTS", ports),
		valueEnv("ISTIO_META_APP_CONTAINERS", strings.Join(p.apps, ",")),
	)
	if sidecar {
		env = append(env, resourceEnv("GOMEMLIMIT", "limits.memory"), resourceEnv("GOMAXPROCS", "limits.cpu"))
	}
	env = append(env,
		valueEnv("ISTIO_META_CLUSTER_ID", p.cfg.ClusterID),
		fieldEnv("ISTIO_META_NODE_NAME", "spec.nodeName"),
	)
	if sidecar {
		env = append(env, valueEnv("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"))
	}
	if p.network != "" {
		env = append(env, valueEnv("ISTIO_META_NETWORK", p.network))
	}
	workload := p.deploy.name
	if sidecar {
		workload = firstNonEmpty(p.pod.Labels[LabelWorkloadName], workload)
	}
	if workload != "" {
		env = append(env, valueEnv("ISTIO_META_WORKLOAD_NAME", workload))
	}
	if p.deploy.name != "" && p.deploy.apiVersion != "" {
		ns := firstNonEmpty(p.deploy.namespace, "default")
		env = append(env, valueEnv("ISTIO_META_OWNER", fmt.Sprintf("kubernetes://apis/%s/namespaces/%s/%ss/%s",
			p.deploy.apiVersion, ns, strings.ToLower(p.deploy.kind), p.deploy.name)))
	}
	env = append(env,
		valueEnv("ISTIO_META_MESH_ID", p.cfg.MeshID),
		valueEnv("TRUST_DOMAIN", p.cfg.TrustDomain),
	)
	return append(env, p.metadataEnv()...), nil
}

// metadataEnv is the ProxyConfig's proxyMetadata as variables, sorted.
func (p *params) metadataEnv() []corev1.EnvVar {
	var env []corev1.EnvVar
	for _, k := range sortedKeys(p.pc.GetProxyMetadata()) {
		env = append(env, valueEnv(k, p.pc.GetProxyMetadata()[k]))
	}
	return env
}

func emptyDir(name string, medium corev1.StorageMedium) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium}}}
}

func podInfoVolume() corev1.Volume {
	return corev1.Volume{Name: "istio-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
		},
	}}}
}

func tokenVolume() corev1.Volume {
	return corev1.Volume{Name: "istio-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
			Path:              "istio-token",
			ExpirationSeconds: ptr.To[int64](43200),
			Audience:          "istio-ca",
		}}},
	}}}
}

func configMapVolume(name, configMap string, optional bool) corev1.Volume {
	v := corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: configMap},
	}}}
	if optional {
		v.ConfigMap.Optional = ptr.To(true)
	}
	return v
}

func mount(name, path string) corev1.VolumeMount {
	return corev1.VolumeMount{Name: name, MountPath: path}
}

// render runs the named template. Whatever the template, a pod on a
// network is labelled topology.istio.io/network, as Istio's injector
// labels it, unless it has that label already.
func render(name string, p *params) (*injection, error) {
	var inj *injection
	var err error
	switch name {
	case TemplateSidecar:
		inj, err = renderSidecar(p)
	case TemplateGRPCAgent:
		inj, err = renderGRPCAgent(p)
	default:
		return nil, fmt.Errorf("%w %q (known: %s, %s)", ErrUnknownTemplate, name, TemplateSidecar, TemplateGRPCAgent)
	}
	if err != nil {
		return nil, err
	}
	if _, ok := p.pod.Labels[LabelNetwork]; !ok && p.network != "" {
		inj.labels[LabelNetwork] = p.network
	}
	return inj, nil
}
