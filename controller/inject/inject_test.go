package inject

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
)

func testConfig() Config {
	return Config{
		Hub:              "hub.example/istio",
		Tag:              "1.32.0",
		DiscoveryAddress: "canopy-controller.istio-system.svc:15012",
	}
}

// testPod is a Deployment's pod with a named-port HTTP readiness probe, a
// TCP liveness probe and an init container of its own.
func testPod() *corev1.Pod {
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
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "reviews",
			InitContainers:     []corev1.Container{{Name: "migrate", Image: "example/migrate:1"}},
			Containers: []corev1.Container{
				{
					Name:  "reviews",
					Image: "example/reviews:1",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 9080, Protocol: corev1.ProtocolTCP}},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}},
						TimeoutSeconds: 2,
					},
					LivenessProbe: &corev1.Probe{
						ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9080)}},
					},
				},
				{Name: "logger", Image: "example/logger:1"},
			},
		},
	}
}

func annotated(kv ...string) func(*corev1.Pod, *Config) {
	return func(p *corev1.Pod, _ *Config) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// goldenCases are the injected pods under testdata: each template and
// mode, and each honoured annotation.
func goldenCases() []struct {
	name string
	mod  func(*corev1.Pod, *Config)
} {
	return []struct {
		name string
		mod  func(*corev1.Pod, *Config)
	}{
		{"sidecar", nil},
		{"sidecar_cni", func(_ *corev1.Pod, c *Config) { c.CNI = true }},
		{"sidecar_native", func(_ *corev1.Pod, c *Config) { c.NativeSidecars = true }},
		{"sidecar_hold", func(_ *corev1.Pod, c *Config) { c.HoldApplicationUntilProxyStarts = true }},
		{"sidecar_config", func(_ *corev1.Pod, c *Config) {
			c.Revision = "canary"
			c.TrustDomain = "example.org"
			c.ClusterID = "east"
			c.MeshID = "mesh1"
			c.Network = "net1"
			c.ClusterDomain = "corp.local"
			c.CAAddress = "canopy-ca.istio-system.svc:15012"
			c.ImagePullPolicy = corev1.PullIfNotPresent
			c.ProxyResources = &corev1.ResourceRequirements{}
		}},
		{"sidecar_plain_pod", func(p *corev1.Pod, _ *Config) {
			p.GenerateName, p.Name, p.OwnerReferences = "", "standalone", nil
			p.Labels = map[string]string{"app.kubernetes.io/name": "standalone", "app.kubernetes.io/version": "2"}
		}},
		{"grpc_agent", annotated(AnnotationTemplates, TemplateGRPCAgent)},
		{"anno_proxyImage", annotated(AnnotationProxyImage, "registry.example/mesh/proxyv2:1.32.0-patched")},
		{"anno_proxyImageType", annotated(AnnotationProxyImageType, "distroless")},
		{"anno_proxyCPU", annotated(AnnotationProxyCPU, "250m")},
		{"anno_proxyMemory", annotated(AnnotationProxyMemory, "256Mi")},
		{"anno_proxyCPULimit", annotated(AnnotationProxyCPULimit, "1")},
		{"anno_proxyMemoryLimit", annotated(AnnotationProxyMemoryLimit, "512Mi")},
		{"anno_logLevel", annotated(AnnotationLogLevel, "debug")},
		{"anno_componentLogLevel", annotated(AnnotationComponentLogLevel, "upstream:debug,connection:trace")},
		{"anno_agentLogLevel", annotated(AnnotationAgentLogLevel, "default:debug")},
		{"anno_statusPort", annotated(AnnotationStatusPort, "15030")},
		{"anno_statusPort_off", annotated(AnnotationStatusPort, "0")},
		{"anno_readiness", annotated(
			AnnotationReadinessInitialDelay, "5",
			AnnotationReadinessPeriod, "7",
			AnnotationReadinessFailure, "9")},
		{"anno_rewriteAppHTTPProbers_false", annotated(AnnotationRewriteProbes, "false")},
		{"anno_proxyConfig", annotated(AnnotationProxyConfig,
			"holdApplicationUntilProxyStarts: true\nconcurrency: 2\nproxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n  ISTIO_META_ENABLE_HBONE: \"true\"\n")},
		{"anno_nativeSidecar", annotated(AnnotationNativeSidecar, "true")},
		{"anno_interceptionMode", annotated(AnnotationInterceptionMode, "REDIRECT")},
		{"anno_traffic", annotated(
			AnnotationIncludeOutboundRanges, "10.0.0.0/8",
			AnnotationExcludeOutboundRanges, "10.96.0.1/32",
			AnnotationIncludeInboundPorts, "9080",
			AnnotationExcludeInboundPorts, "9090",
			AnnotationIncludeOutboundPorts, "443",
			AnnotationExcludeOutboundPorts, "3306,5432")},
		{"anno_traffic_cni", func(p *corev1.Pod, c *Config) {
			c.CNI = true
			annotated(
				AnnotationIncludeOutboundRanges, "10.0.0.0/8",
				AnnotationExcludeOutboundRanges, "10.96.0.1/32",
				AnnotationIncludeInboundPorts, "9080",
				AnnotationExcludeInboundPorts, "9090",
				AnnotationIncludeOutboundPorts, "443",
				AnnotationExcludeOutboundPorts, "3306,5432")(p, c)
		}},
		{"anno_default_container", annotated(AnnotationDefaultContainer, "logger", AnnotationDefaultLogsContainer, "logger")},
		{"anno_interfaces", annotated(AnnotationKubevirtInterfaces, "k6t-eth0", AnnotationExcludeInterfaces, "eth1,eth2")},
		{"anno_interfaces_cni", func(p *corev1.Pod, c *Config) {
			c.CNI = true
			annotated(AnnotationRerouteInterfaces, "tap0", AnnotationKubevirtInterfaces, "k6t-eth0", AnnotationExcludeInterfaces, "eth1")(p, c)
		}},
	}
}

func toYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGolden checks the injected pod of each case against
// testdata/<case>.golden, that Inject's patch applied to the original pod
// gives that same pod, and that injecting the result again changes
// nothing.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, tt := range goldenCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod, cfg := testPod(), testConfig()
			if tt.mod != nil {
				tt.mod(pod, &cfg)
			}
			before := toYAML(t, pod)

			got, err := Mutate(pod, cfg)
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			if diff := cmp.Diff(string(before), string(toYAML(t, pod))); diff != "" {
				t.Fatalf("Mutate modified its input:\n%s", diff)
			}
			got.ManagedFields = nil // Inject leaves them to the API server
			want := toYAML(t, got)
			golden.Check(t, tt.name+".golden", want)

			applied := applyPatch(t, pod, cfg)
			if diff := cmp.Diff(string(want), string(toYAML(t, applied))); diff != "" {
				t.Errorf("patched pod differs from the injected pod (-want +got):\n%s", diff)
			}

			again, err := Inject(applied, cfg)
			if err != nil || again != nil {
				t.Errorf("Inject(injected pod) = %s, %v; want no patch", again, err)
			}
			same, err := Mutate(applied, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), string(toYAML(t, same))); diff != "" {
				t.Errorf("Mutate(injected pod) changed it:\n%s", diff)
			}
		})
	}
}

// applyPatch applies Inject's patch to pod (without its managed fields,
// as the patch is computed) with an independent RFC 6902 implementation.
func applyPatch(t *testing.T, pod *corev1.Pod, cfg Config) *corev1.Pod {
	t.Helper()
	patch, err := Inject(pod, cfg)
	if err != nil {
		t.Fatalf("Inject: %v", err)
	}
	orig := pod.DeepCopy()
	orig.ManagedFields = nil
	doc, err := json.Marshal(orig)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("decode patch: %v\n%s", err, patch)
	}
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("apply patch: %v\n%s", err, patch)
	}
	var applied corev1.Pod
	if err := json.Unmarshal(out, &applied); err != nil {
		t.Fatal(err)
	}
	return &applied
}

func TestRefusedAnnotations(t *testing.T) {
	t.Parallel()
	for _, r := range refusedAnnotations() {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			pod := testPod()
			annotated(r.name, "true")(pod, nil)
			_, err := Inject(pod, testConfig())
			var refused *RefusedError
			if !errors.As(err, &refused) || refused.Annotation != r.name {
				t.Fatalf("Inject() error = %v, want a RefusedError for %s", err, r.name)
			}
			if !strings.Contains(err.Error(), r.name) {
				t.Errorf("message %q does not name %s", err, r.name)
			}
		})
	}
}

func TestInjectErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		mod     func(*corev1.Pod, *Config)
		want    string
		refused bool
		unknown bool
	}{
		{name: "interception TPROXY", mod: annotated(AnnotationInterceptionMode, "TPROXY"), want: "sidecar.istio.io/interceptionMode", refused: true},
		{name: "interception NONE", mod: annotated(AnnotationInterceptionMode, "NONE"), want: "only REDIRECT", refused: true},
		{name: "merge metrics on", mod: annotated("prometheus.istio.io/merge-metrics", "true"), want: "merge-metrics", refused: true},
		{name: "interception in proxy config", mod: annotated(AnnotationProxyConfig, "interceptionMode: TPROXY"), want: "interceptionMode: TPROXY", refused: true},
		{name: "unknown template", mod: annotated(AnnotationTemplates, "gateway"), want: `unknown injection template "gateway"`, unknown: true},
		{name: "two templates", mod: annotated(AnnotationTemplates, "sidecar,grpc-agent"), want: "exactly one template"},
		{name: "no template", mod: annotated(AnnotationTemplates, " , "), want: "names no template"},
		{name: "bad proxy config", mod: annotated(AnnotationProxyConfig, "concurrency: lots"), want: "not a ProxyConfig"},
		{name: "bad quantity", mod: annotated(AnnotationProxyCPU, "fast"), want: "sidecar.istio.io/proxyCPU"},
		{name: "bad status port", mod: annotated(AnnotationStatusPort, "70000"), want: "status.sidecar.istio.io/port"},
		{name: "bad CIDR", mod: annotated(AnnotationExcludeOutboundRanges, "10.0.0.0/33"), want: "excludeOutboundIPRanges"},
		{name: "bad ports", mod: annotated(AnnotationExcludeInboundPorts, "80,http"), want: `"http" is not a port`},
		{name: "bad readiness", mod: annotated(AnnotationReadinessPeriod, "-1"), want: "periodSeconds"},
		{name: "bad interface", mod: annotated(AnnotationExcludeInterfaces, "eth0 eth1"), want: "excludeInterfaces"},
		{name: "empty interface", mod: annotated(AnnotationRerouteInterfaces, "tap0,,tap1"), want: "reroute-virtual-interfaces"},
		{name: "long interface", mod: annotated(AnnotationKubevirtInterfaces, "abcdefghijklmnop"), want: "kubevirtInterfaces"},
		{name: "line break in log level", mod: annotated(AnnotationLogLevel, "debug\n--evil"), want: "control character"},
		{name: "own istio-proxy", mod: func(p *corev1.Pod, _ *Config) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: ProxyContainer})
		}, want: "already defines container istio-proxy"},
		{name: "own istio-init", mod: func(p *corev1.Pod, _ *Config) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: InitContainer})
		}, want: "already defines container istio-init"},
		{name: "own volume", mod: func(p *corev1.Pod, _ *Config) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "istio-data"})
		}, want: "already defines volume istio-data"},
		{name: "invalid config", mod: func(_ *corev1.Pod, c *Config) { c.Hub = "" }, want: "hub is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod, cfg := testPod(), testConfig()
			tt.mod(pod, &cfg)
			_, err := Inject(pod, cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Inject() error = %v, want one containing %q", err, tt.want)
			}
			var refused *RefusedError
			if got := errors.As(err, &refused); got != tt.refused {
				t.Errorf("errors.As(RefusedError) = %v, want %v", got, tt.refused)
			}
			if got := errors.Is(err, ErrUnknownTemplate); got != tt.unknown {
				t.Errorf("errors.Is(ErrUnknownTemplate) = %v, want %v", got, tt.unknown)
			}
		})
	}
}

func TestAcceptedValuesOfRefusableAnnotations(t *testing.T) {
	t.Parallel()
	pod := testPod()
	annotated("prometheus.istio.io/merge-metrics", "false", AnnotationInterceptionMode, "REDIRECT",
		AnnotationProxyConfig, "interceptionMode: REDIRECT")(pod, nil)
	if _, err := Inject(pod, testConfig()); err != nil {
		t.Fatalf("Inject() error = %v", err)
	}
}

func TestProxyImage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ tag, typ, want string }{
		{"1.32.0", "", "hub/proxyv2:1.32.0"},
		{"1.32.0", "default", "hub/proxyv2:1.32.0"},
		{"1.32.0", "distroless", "hub/proxyv2:1.32.0-distroless"},
		{"1.32.0-distroless", "debug", "hub/proxyv2:1.32.0-debug"},
		{"1.32.0-distroless", "default", "hub/proxyv2:1.32.0"},
		{"1.32.0-distroless", "", "hub/proxyv2:1.32.0-distroless"},
	} {
		if got := proxyImage("hub", tt.tag, tt.typ); got != tt.want {
			t.Errorf("proxyImage(hub, %q, %q) = %q, want %q", tt.tag, tt.typ, got, tt.want)
		}
	}
}

// TestNetwork checks the pod's network as Istio's injector writes it:
// ISTIO_META_NETWORK and the topology.istio.io/network label, the pod's
// own label beating the configured network, for both templates.
func TestNetwork(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, configured string
		label            *string
		template         string
		wantEnv          string // "" for no variable
		wantLabel        *string
	}{
		{name: "none"},
		{name: "configured", configured: "net1", wantEnv: "net1", wantLabel: ptr.To("net1")},
		{name: "pod label wins", configured: "net1", label: ptr.To("net2"), wantEnv: "net2", wantLabel: ptr.To("net2")},
		{name: "pod label only", label: ptr.To("net2"), wantEnv: "net2", wantLabel: ptr.To("net2")},
		{name: "empty pod label", configured: "net1", label: ptr.To(""), wantEnv: "net1", wantLabel: ptr.To("")},
		{name: "grpc-agent", configured: "net1", label: ptr.To("net2"), template: TemplateGRPCAgent, wantEnv: "net2", wantLabel: ptr.To("net2")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod, cfg := testPod(), testConfig()
			cfg.Network = tt.configured
			if tt.label != nil {
				pod.Labels[LabelNetwork] = *tt.label
			}
			if tt.template != "" {
				annotated(AnnotationTemplates, tt.template)(pod, &cfg)
			}
			got, err := Mutate(pod, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var env string
			for _, c := range got.Spec.Containers {
				if c.Name != ProxyContainer {
					continue
				}
				for _, e := range c.Env {
					if e.Name == "ISTIO_META_NETWORK" {
						env = e.Value
					}
				}
			}
			if env != tt.wantEnv {
				t.Errorf("ISTIO_META_NETWORK = %q, want %q", env, tt.wantEnv)
			}
			l, ok := got.Labels[LabelNetwork]
			if tt.wantLabel == nil && ok {
				t.Errorf("label %s = %q, want none", LabelNetwork, l)
			}
			if tt.wantLabel != nil && (!ok || l != *tt.wantLabel) {
				t.Errorf("label %s = %q (set: %t), want %q", LabelNetwork, l, ok, *tt.wantLabel)
			}
		})
	}
}
