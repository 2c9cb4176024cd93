package inject

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/tools"
)

// istioCase is one pod injected by both injectors with one configuration.
type istioCase struct {
	name string
	pod  *corev1.Pod
	cfg  Config
}

// deploymentPod is a pod of Deployment reviews-v1 with one container and
// its ports.
func deploymentPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "reviews-v1-5c7b9f6d4-",
			Namespace:    "demo",
			Labels:       map[string]string{"app": "reviews", "version": "v1", "pod-template-hash": "5c7b9f6d4"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "reviews-v1-5c7b9f6d4", UID: "3c4e",
				Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "reviews",
			Containers: []corev1.Container{{
				Name:  "reviews",
				Image: "example/reviews:1",
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 9080, Protocol: corev1.ProtocolTCP},
					{Name: "grpc", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
				},
			}},
		},
	}
}

// probedPod is deploymentPod with an init container of its own, a second
// container, HTTP readiness (named port) and liveness (number) probes, a
// TCP startup probe, a gRPC probe and HTTP and TCP lifecycle hooks.
func probedPod() *corev1.Pod {
	p := deploymentPod()
	p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "example/migrate:1"}}
	c := &p.Spec.Containers[0]
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}},
		TimeoutSeconds: 2,
		PeriodSeconds:  5,
	}
	c.LivenessProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/live", Port: intstr.FromInt32(9080), Scheme: corev1.URISchemeHTTPS,
			HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "1"}},
		}},
		InitialDelaySeconds: 3,
	}
	c.StartupProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9080)}},
	}
	c.Lifecycle = &corev1.Lifecycle{
		PreStop:   &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/quit", Port: intstr.FromInt32(9080)}},
		PostStart: &corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}},
	}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
		Name:  "ratings",
		Image: "example/ratings:1",
		Ports: []corev1.ContainerPort{{ContainerPort: 7070, Protocol: corev1.ProtocolTCP}},
		LivenessProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 7070, Service: ptr.To("health")}},
		},
	})
	return p
}

func withAnnotations(p *corev1.Pod, kv ...string) *corev1.Pod {
	annotated(kv...)(p, nil)
	return p
}

func istioCases() []istioCase {
	base := Config{
		Hub:              "hub.example/istio",
		Tag:              "1.32.0",
		DiscoveryAddress: "canopy-controller.istio-system.svc:15012",
	}
	with := func(f func(*Config)) Config {
		c := base
		f(&c)
		return c
	}
	return []istioCase{
		{"plain", deploymentPod(), base},
		{"plain_cni", deploymentPod(), with(func(c *Config) { c.CNI = true })},
		{"probes", probedPod(), base},
		{"annotations", withAnnotations(deploymentPod(),
			AnnotationProxyCPU, "250m",
			AnnotationProxyMemory, "256Mi",
			AnnotationProxyCPULimit, "1",
			AnnotationProxyMemoryLimit, "512Mi",
			AnnotationLogLevel, "debug",
			AnnotationComponentLogLevel, "upstream:debug",
			AnnotationAgentLogLevel, "default:debug",
			AnnotationProxyConfig, "concurrency: 2\nproxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n"), base},
		{"hold", probedPod(), with(func(c *Config) { c.HoldApplicationUntilProxyStarts = true })},
		{"native", probedPod(), with(func(c *Config) { c.NativeSidecars = true })},
		{"native_cni", deploymentPod(), with(func(c *Config) { c.NativeSidecars, c.CNI = true, true })},
		{"grpc_agent", withAnnotations(deploymentPod(), AnnotationTemplates, TemplateGRPCAgent), base},
		{"mesh_settings", probedPod(), with(func(c *Config) {
			c.TrustDomain = "example.org"
			c.ClusterID = "east"
			c.MeshID = "mesh1"
			c.Network = "net1"
			c.ClusterDomain = "corp.local"
			c.CAAddress = "canopy-ca.istio-system.svc:15012"
			c.ImagePullPolicy = corev1.PullIfNotPresent
			c.ProxyResources = &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")},
			}
			c.DisableAppProbeRewrite = true
		})},
		{"network_label", withLabels(deploymentPod(), LabelNetwork, "net2"), with(func(c *Config) { c.Network = "net1" })},
		{"traffic", withAnnotations(probedPod(), trafficAnnotations...), base},
		{"traffic_cni", withAnnotations(probedPod(), trafficAnnotations...), with(func(c *Config) { c.CNI = true })},
		{"interfaces", withAnnotations(deploymentPod(), AnnotationKubevirtInterfaces, "k6t-eth0", AnnotationExcludeInterfaces, "eth1,eth2"), base},
		{"interfaces_reroute", withAnnotations(deploymentPod(), AnnotationRerouteInterfaces, "tap0", AnnotationKubevirtInterfaces, "k6t-eth0"), base},
		{"interfaces_cni", withAnnotations(deploymentPod(), AnnotationRerouteInterfaces, "tap0", AnnotationExcludeInterfaces, "eth1"), with(func(c *Config) { c.CNI = true })},
		{"status_port", withAnnotations(probedPod(),
			AnnotationStatusPort, "15030",
			AnnotationReadinessInitialDelay, "5",
			AnnotationReadinessPeriod, "7",
			AnnotationReadinessFailure, "9"), base},
		{"status_port_off", withAnnotations(probedPod(), AnnotationStatusPort, "0"), base},
		{"no_probe_rewrite", withAnnotations(probedPod(), AnnotationRewriteProbes, "false"), base},
		{"native_annotation", withAnnotations(probedPod(), AnnotationNativeSidecar, "true"), base},
		{"hold_proxy_config", withAnnotations(probedPod(), AnnotationProxyConfig,
			"holdApplicationUntilProxyStarts: true\nproxyMetadata:\n  ISTIO_META_ENABLE_HBONE: \"true\"\n"), base},
		{"images", withAnnotations(deploymentPod(),
			AnnotationProxyImageType, "distroless",
			AnnotationDefaultContainer, "reviews",
			AnnotationInterceptionMode, "REDIRECT"), with(func(c *Config) { c.Tag = "1.32.0-debug" })},
		{"proxy_image", withAnnotations(deploymentPod(), AnnotationProxyImage, "registry.example/mesh/proxyv2:patched"), base},
		{"bare_pod", func() *corev1.Pod {
			p := deploymentPod()
			p.GenerateName, p.Name, p.OwnerReferences = "", "standalone", nil
			p.Labels = map[string]string{"app.kubernetes.io/name": "standalone", "app.kubernetes.io/version": "2"}
			return p
		}(), with(func(c *Config) { c.Revision = "canary" })},
		{"cronjob_pod", func() *corev1.Pod {
			p := deploymentPod()
			p.GenerateName = "backup-28843200-"
			p.Labels = map[string]string{"job-name": "backup-28843200"}
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "backup-28843200", UID: "77", Controller: ptr.To(true)}}
			return p
		}(), base},
		{"grpc_agent_probes", withAnnotations(probedPod(), AnnotationTemplates, TemplateGRPCAgent, AnnotationProxyCPU, "20m"), base},
		{"native_off_annotation", withAnnotations(probedPod(), AnnotationNativeSidecar, "false"), with(func(c *Config) { c.NativeSidecars = true })},
		{"native_status_port", withAnnotations(deploymentPod(), AnnotationStatusPort, "15030"), with(func(c *Config) { c.NativeSidecars = true })},
		{"memory_only", withAnnotations(deploymentPod(), AnnotationProxyMemory, "64Mi"), base},
		{"own_labels", withLabels(deploymentPod(),
			LabelTLSMode, "disabled",
			LabelCanonicalName, "-reviews-with-a-very-long-canonical-name-that-goes-past-sixty-three-chars-",
			LabelCanonicalRev, "r7",
			LabelWorkloadName, "reviews-workload"), base},
		{"odd_pod", func() *corev1.Pod {
			p := probedPod()
			p.GenerateName = "web-1-"
			p.Labels = map[string]string{"deploymentconfig": "web"}
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ReplicationController", Name: "web-1", UID: "9", Controller: ptr.To(true)}}
			p.Spec.Containers[1].Ports = nil
			p.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromInt32(15020)
			p.Spec.InitContainers[0].StartupProbe = &corev1.Probe{
				ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/s", Port: intstr.FromInt32(8081), Host: "127.0.0.1"}},
			}
			return p
		}(), with(func(c *Config) { c.NativeSidecars = true })},
	}
}

var trafficAnnotations = []string{
	AnnotationIncludeOutboundRanges, "10.0.0.0/8",
	AnnotationExcludeOutboundRanges, "10.96.0.1/32",
	AnnotationIncludeInboundPorts, "9080",
	AnnotationExcludeInboundPorts, "9090",
	AnnotationIncludeOutboundPorts, "443",
	AnnotationExcludeOutboundPorts, "3306,5432",
}

func withLabels(p *corev1.Pod, kv ...string) *corev1.Pod {
	for i := 0; i+1 < len(kv); i += 2 {
		p.Labels[kv[i]] = kv[i+1]
	}
	return p
}

// istioFiles are the inputs of istioctl kube-inject equivalent to a
// Canopy Config: the values istiod's istio-sidecar-injector ConfigMap
// carries (its "values" key), the mesh config of the istio ConfigMap, the
// revision flag and the environment istioctl reads.
type istioFiles struct {
	values   map[string]any
	mesh     map[string]any
	revision string
	env      []string
}

func istioInputs(cfg Config) istioFiles {
	cfg = cfg.withDefaults()
	resources := map[string]any{}
	if r := cfg.ProxyResources; len(r.Requests) > 0 || len(r.Limits) > 0 {
		b, _ := json.Marshal(r)
		_ = json.Unmarshal(b, &resources)
	}
	proxy := map[string]any{
		"image":                           "proxyv2",
		"autoInject":                      string(cfg.Policy),
		"clusterDomain":                   cfg.ClusterDomain,
		"componentLogLevel":               cfg.ProxyComponentLogLevel,
		"logLevel":                        cfg.ProxyLogLevel,
		"excludeInboundPorts":             "",
		"includeInboundPorts":             "*",
		"includeIPRanges":                 "*",
		"excludeIPRanges":                 "",
		"includeOutboundPorts":            "",
		"excludeOutboundPorts":            "",
		"outlierLogPath":                  "",
		"privileged":                      false,
		"seccompProfile":                  map[string]any{},
		"readinessFailureThreshold":       4,
		"readinessInitialDelaySeconds":    0,
		"readinessPeriodSeconds":          15,
		"startupProbe":                    map[string]any{"enabled": true, "failureThreshold": 600},
		"resources":                       resources,
		"statusPort":                      15020,
		"tracer":                          "none",
		"holdApplicationUntilProxyStarts": cfg.HoldApplicationUntilProxyStarts,
	}
	global := map[string]any{
		"hub":                cfg.Hub,
		"tag":                cfg.Tag,
		"variant":            "",
		"istioNamespace":     cfg.SystemNamespace,
		"caAddress":          cfg.CAAddress,
		"imagePullPolicy":    string(cfg.ImagePullPolicy),
		"imagePullSecrets":   []any{},
		"logAsJson":          false,
		"nativeNftables":     false,
		"logging":            map[string]any{"level": cfg.AgentLogLevel},
		"proxy":              proxy,
		"proxy_init":         map[string]any{"image": "proxyv2", "forceApplyIptables": false},
		"remotePilotAddress": "",
		"meshID":             cfg.MeshID,
		"mountMtlsCerts":     false,
		"multiCluster":       map[string]any{"clusterName": cfg.ClusterID},
		"network":            cfg.Network,
		"pilotCertProvider":  "istiod",
		"sds":                map[string]any{"token": map[string]any{"aud": "istio-ca"}},
		"sts":                map[string]any{"servicePort": 0},
		"caName":             "",
		"trustDomain":        cfg.TrustDomain,
	}
	revision := cfg.Revision
	native := "false"
	if cfg.NativeSidecars {
		native = "true"
	}
	return istioFiles{
		values: map[string]any{
			"global": global,
			"sidecarInjectorWebhook": map[string]any{
				"rewriteAppHTTPProbe":  !cfg.DisableAppProbeRewrite,
				"templates":            map[string]any{},
				"defaultTemplates":     []any{},
				"injectedAnnotations":  map[string]any{},
				"neverInjectSelector":  []any{},
				"alwaysInjectSelector": []any{},
			},
			"revision": revision,
			"pilot": map[string]any{
				"cni": map[string]any{"enabled": cfg.CNI, "provider": "default"},
				"env": map[string]any{},
			},
			"gateways": map[string]any{"securityContext": map[string]any{}, "seccompProfile": map[string]any{}},
		},
		mesh: map[string]any{
			"trustDomain":   cfg.TrustDomain,
			"rootNamespace": cfg.SystemNamespace,
			// Canopy does not merge application metrics into
			// pilot-agent's (docs/sidecar-injection.md).
			"enablePrometheusMerge": false,
			"defaultConfig":         map[string]any{"discoveryAddress": cfg.DiscoveryAddress},
		},
		revision: cfg.revisionName(),
		env:      []string{"ENABLE_NATIVE_SIDECARS=" + native},
	}
}

// istioReference is what the Istio side of the test needs: the pinned
// istioctl and the injection templates of the same istio.io/istio module.
type istioReference struct {
	istioctl  string
	templates map[string]string // template name → text
}

func findIstioReference(t *testing.T) istioReference {
	t.Helper()
	dir := os.Getenv(tools.EnvVar("istio"))
	if dir == "" {
		ci.Unavailable(t, "$%s is not set (set it to the directory hack/tools.sh istio prints)", tools.EnvVar("istio"))
	}
	bin := filepath.Join(dir, "istioctl")
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		ci.Unavailable(t, "no istioctl in $%s=%s (hack/tools.sh istio builds it)", tools.EnvVar("istio"), dir)
	}
	root, err := tools.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	version := istioPin(t, filepath.Join(root, "tools", "istio", "go.mod"))
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	files := filepath.Join(strings.TrimSpace(string(out)), "istio.io", "istio@"+version,
		"manifests", "charts", "istio-control", "istio-discovery", "files")
	ref := istioReference{istioctl: bin, templates: map[string]string{}}
	for name, file := range map[string]string{TemplateSidecar: "injection-template.yaml", TemplateGRPCAgent: "grpc-agent.yaml"} {
		b, err := os.ReadFile(filepath.Join(files, file))
		if err != nil {
			ci.Unavailable(t, "Istio's injection templates are not in the module cache (hack/tools.sh istio downloads istio.io/istio %s): %v", version, err)
		}
		ref.templates[name] = string(b)
	}
	return ref
}

// istioPin is the version of istio.io/istio that tools/istio/go.mod
// requires.
func istioPin(t *testing.T, gomod string) string {
	t.Helper()
	b, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == "istio.io/istio" {
			return f[1]
		}
	}
	t.Fatalf("%s does not require istio.io/istio", gomod)
	return ""
}

// kubeInject runs istioctl kube-inject offline on pod with the files of
// cfg and returns the injected pod.
func (r istioReference) kubeInject(t *testing.T, pod *corev1.Pod, cfg Config) *corev1.Pod {
	t.Helper()
	dir := t.TempDir()
	in := istioInputs(cfg)
	write := func(name string, v any) string {
		var b []byte
		var err error
		switch v := v.(type) {
		case []byte:
			b = v
		default:
			b, err = json.MarshalIndent(v, "", "  ")
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The injector's config, as the ConfigMap's "config" key holds it.
	injectCfg := map[string]any{
		"defaultTemplates": []string{TemplateSidecar},
		"policy":           string(cfg.withDefaults().Policy),
		"templates":        r.templates,
	}
	injectYAML, err := yaml.Marshal(injectCfg)
	if err != nil {
		t.Fatal(err)
	}
	podYAML, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "injected.yaml")
	cmd := exec.CommandContext(t.Context(), r.istioctl, "kube-inject",
		// An explicit revision keeps istioctl from asking a cluster
		// for its default one.
		"--revision", in.revision,
		"--kubeconfig", filepath.Join(dir, "no-kubeconfig"),
		"--injectConfigFile", write("inject-config.yaml", injectYAML),
		"--meshConfigFile", write("mesh.yaml", in.mesh),
		"--valuesFile", write("values.json", in.values),
		"-f", write("pod.yaml", podYAML),
		"-o", out)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.Env = append(cmd.Env, in.env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("istioctl kube-inject: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(b, []byte("\n---\n"))
	var got corev1.Pod
	if err := yaml.UnmarshalStrict(docs[0], &got); err != nil {
		t.Fatalf("istioctl's output: %v\n%s", err, b)
	}
	return &got
}

// flatten adds v (parsed JSON) under prefix to fields: an object key by
// key (one level: nested values are compared whole), anything else as its
// JSON.
func flatten(fields map[string]string, prefix string, v any) {
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		for k, e := range m {
			fields[prefix+"."+k] = string(must(json.Marshal(e)))
		}
		return
	}
	fields[prefix] = string(must(json.Marshal(v)))
}

func toJSONValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// jsonEnv are the variables whose value is JSON, compared structurally.
var jsonEnv = map[string]bool{"PROXY_CONFIG": true, appProbersEnv: true, "ISTIO_META_POD_PORTS": true}

// podFields are the fields of an injected pod that the comparison looks
// at, by path: labels and annotations by key (the injection status
// parsed), containers and init containers by name and their order, each
// container's environment by name (JSON values parsed) and mounts by
// path, volumes by name, and the rest of the spec.
func podFields(p *corev1.Pod) map[string]string {
	f := map[string]string{}
	for k, v := range p.Labels {
		f["labels["+k+"]"] = v
	}
	for k, v := range p.Annotations {
		var js map[string]any
		if k == AnnotationStatus && json.Unmarshal([]byte(v), &js) == nil {
			flatten(f, "annotations["+k+"]", js)
			continue
		}
		f["annotations["+k+"]"] = v
	}
	containers := func(kind string, cs []corev1.Container) {
		var names []string
		for _, c := range cs {
			names = append(names, c.Name)
			pre := kind + "[" + c.Name + "]"
			for _, e := range c.Env {
				key := pre + ".env[" + e.Name + "]"
				var js any
				if jsonEnv[e.Name] && e.ValueFrom == nil && json.Unmarshal([]byte(e.Value), &js) == nil {
					flatten(f, key, js)
					continue
				}
				flatten(f, key, toJSONValue(e))
			}
			for _, m := range c.VolumeMounts {
				f[pre+".volumeMounts["+m.MountPath+"]"] = string(must(json.Marshal(m)))
			}
			rest := c.DeepCopy()
			rest.Env, rest.VolumeMounts = nil, nil
			for k, v := range toJSONValue(rest).(map[string]any) {
				if k == "name" {
					continue
				}
				b, _ := json.Marshal(v)
				f[pre+"."+k] = string(b)
			}
		}
		f[kind+".order"] = strings.Join(names, ",")
	}
	containers("initContainers", p.Spec.InitContainers)
	containers("containers", p.Spec.Containers)
	for _, v := range p.Spec.Volumes {
		f["volumes["+v.Name+"]"] = string(must(json.Marshal(v)))
	}
	spec := p.Spec.DeepCopy()
	spec.InitContainers, spec.Containers, spec.Volumes = nil, nil, nil
	for k, v := range toJSONValue(spec).(map[string]any) {
		f["spec."+k] = string(must(json.Marshal(v)))
	}
	meta := p.ObjectMeta.DeepCopy()
	meta.Labels, meta.Annotations = nil, nil
	for k, v := range toJSONValue(meta).(map[string]any) {
		f["metadata."+k] = string(must(json.Marshal(v)))
	}
	return f
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// allowed is an entry of testdata/istio-allowlist.yaml: a field of the
// injected pod where Canopy differs from Istio's injector, in the cases
// named (every case when none is), and why.
type allowed struct {
	Field  string   `json:"field"`
	Cases  []string `json:"cases,omitempty"`
	Reason string   `json:"reason"`
}

func (a allowed) covers(c string) bool { return len(a.Cases) == 0 || slices.Contains(a.Cases, c) }

// TestMatchesIstioInjector injects each pod of istioCases with Istio's
// own istioctl kube-inject (offline, Istio's templates from the pinned
// istio.io/istio, values and mesh config equivalent to the Config) and
// with Mutate, and compares the two pods field by field. It logs the
// score and fails on any difference testdata/istio-allowlist.yaml does
// not list, and on a listed one that no longer occurs.
func TestMatchesIstioInjector(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Istio's istioctl: not a unit test")
	}
	ref := findIstioReference(t)
	var allow []allowed
	b, err := os.ReadFile(filepath.Join("testdata", "istio-allowlist.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &allow); err != nil {
		t.Fatalf("testdata/istio-allowlist.yaml: %v", err)
	}
	for _, a := range allow {
		if a.Field == "" || strings.TrimSpace(a.Reason) == "" {
			t.Fatalf("allow-list entry %+v needs a field and a reason", a)
		}
	}
	used := make([]map[string]bool, len(allow))
	for i := range used {
		used[i] = map[string]bool{}
	}

	// istioctl takes about half a second a pod: run them side by side.
	cases := istioCases()
	wants := make([]*corev1.Pod, len(cases))
	t.Run("istioctl", func(t *testing.T) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				wants[i] = ref.kubeInject(t, tc.pod, tc.cfg)
			})
		}
	})
	if t.Failed() {
		return
	}

	var equal, compared int
	var unexpected []allowed
	for i, tc := range cases {
		want := wants[i]
		got, err := Mutate(tc.pod, tc.cfg)
		if err != nil {
			t.Fatalf("%s: Mutate: %v", tc.name, err)
		}
		wf, gf := podFields(want), podFields(got)
		keys := slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, bool) bool) {
			for k := range wf {
				yield(k, true)
			}
			for k := range gf {
				yield(k, true)
			}
		})))
		caseEqual := 0
		for _, k := range keys {
			compared++
			w, wok := wf[k]
			g, gok := gf[k]
			if wok == gok && w == g {
				equal++
				caseEqual++
				continue
			}
			i := slices.IndexFunc(allow, func(a allowed) bool { return a.Field == k && a.covers(tc.name) })
			if i >= 0 {
				used[i][tc.name] = true
				continue
			}
			show := func(v string, ok bool) string {
				if !ok {
					return "(absent)"
				}
				return v
			}
			t.Errorf("%s: %s\n  istio:  %s\n  canopy: %s", tc.name, k, show(w, wok), show(g, gok))
			unexpected = append(unexpected, allowed{Field: k, Cases: []string{tc.name}, Reason: "TODO"})
		}
		t.Logf("%s: %d of %d fields equal", tc.name, caseEqual, len(keys))
	}
	t.Logf("score: %d of %d fields equal to Istio's injector", equal, compared)

	for i, a := range allow {
		switch {
		case len(a.Cases) == 0 && len(used[i]) == 0:
			t.Errorf("allow-list entry %q no longer differs in any case; remove it", a.Field)
		case len(a.Cases) > 0:
			for _, c := range a.Cases {
				if !used[i][c] {
					t.Errorf("allow-list entry %q no longer differs in case %s; remove the case", a.Field, c)
				}
			}
		}
	}
	if len(unexpected) > 0 {
		t.Logf("entries for testdata/istio-allowlist.yaml (give each its reason from Istio's source):\n%s", must(yaml.Marshal(unexpected)))
	}
}
