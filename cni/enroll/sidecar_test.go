package enroll

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/cni/redirect"
)

// injectedPod is a pod as the injector leaves it for a CNI plugin:
// istio-validation, istio-proxy (uid and gid 1337), the status annotation,
// and annotations on top.
func injectedPod(annotations map[string]string, edit ...func(*corev1.Pod)) *corev1.Pod {
	a := map[string]string{AnnotationSidecarStatus: `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`}
	for k, v := range annotations {
		a[k] = v
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "apps", Annotations: a},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "istio-validation"}},
			Containers: []corev1.Container{
				{Name: "app"},
				{
					Name: ContainerProxy, Args: []string{"proxy", "sidecar", "--domain", "apps.svc.cluster.local"},
					SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1337), RunAsGroup: ptr.To[int64](1337)},
				},
			},
		},
	}
	for _, e := range edit {
		e(p)
	}
	return p
}

func withProxyEnv(name, value string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := &p.Spec.Containers[1]
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
}

func sidecar(f func(*redirect.SidecarConfig)) redirect.PodConfig {
	c := redirect.DefaultSidecarConfig()
	if f != nil {
		f(c)
	}
	return redirect.PodConfig{Sidecar: c}
}

func prefixes(ps ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

var cmpOpts = []cmp.Option{cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}), cmpopts.EquateEmpty()}

func TestDecideSidecar(t *testing.T) {
	t.Parallel()
	cfg := Config{SystemNamespace: "istio-system", ExcludedNamespaces: []string{"kube-system"}, SidecarCapture: true}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps", Labels: map[string]string{LabelDataplaneMode: ModeAmbient}}}
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		cfg  Config
		want Decision
	}{
		{"injected for a CNI plugin", injectedPod(nil), cfg, Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true, Pod: sidecar(nil)}},
		{"native sidecar", injectedPod(nil, func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, p.Spec.Containers[1])
			p.Spec.Containers = p.Spec.Containers[:1]
		}), cfg, Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true, Pod: sidecar(nil)}},
		{"capture off", injectedPod(nil), Config{}, Decision{Reason: "pod has a sidecar"}},
		{"istio-init installs its own", injectedPod(nil, func(p *corev1.Pod) { p.Spec.InitContainers[0].Name = ContainerInit }), cfg,
			Decision{Reason: "pod has istio-init, which installs its own capture"}},
		{"proxyless gRPC", injectedPod(nil, withProxyEnv(EnvDisableEnvoy, "true")), cfg,
			Decision{Reason: "proxyless pod (DISABLE_ENVOY on istio-proxy): no Envoy to capture for"}},
		{"DISABLE_ENVOY false", injectedPod(nil, withProxyEnv(EnvDisableEnvoy, "false")), cfg, Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true, Pod: sidecar(nil)}},
		{"no istio-proxy", injectedPod(nil, func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }), cfg,
			Decision{Reason: "pod has a sidecar status but no istio-proxy container"}},
		{"a gateway's proxy", injectedPod(nil, func(p *corev1.Pod) { p.Spec.Containers[1].Args = []string{"proxy", "router"} }), cfg,
			Decision{Reason: "proxy of type router, not a sidecar"}},
		{"inject=false annotation", injectedPod(map[string]string{AnnotationInject: "false"}), cfg,
			Decision{Reason: "pod refuses a sidecar (sidecar.istio.io/inject=false)"}},
		{"inject=false label beats a true annotation", injectedPod(map[string]string{AnnotationInject: "true"}, func(p *corev1.Pod) {
			p.Labels = map[string]string{LabelInject: "false"}
		}), cfg, Decision{Reason: "pod refuses a sidecar (sidecar.istio.io/inject=false)"}},
		{"inject=true label beats a false annotation", injectedPod(map[string]string{AnnotationInject: "false"}, func(p *corev1.Pod) {
			p.Labels = map[string]string{LabelInject: "true"}
		}), cfg, Decision{Enroll: true, Reason: ReasonSidecar, Sidecar: true, Pod: sidecar(nil)}},
		{"excluded namespace", injectedPod(nil, func(p *corev1.Pod) { p.Namespace = "kube-system" }), cfg, Decision{Reason: "namespace kube-system is excluded"}},
		{"host network", injectedPod(nil, func(p *corev1.Pod) { p.Spec.HostNetwork = true }), cfg, Decision{Reason: "host-network pod"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decide(tt.pod, ns, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpOpts...); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("malformed settings fail, still marked for the mesh", func(t *testing.T) {
		t.Parallel()
		got, err := Decide(injectedPod(map[string]string{AnnotationExcludeOutboundRanges: "10.0.0.0/33"}), ns, cfg)
		if err == nil || !got.Enroll || got.Pod.Sidecar != nil {
			t.Fatalf("Decide() = %+v, %v; want Enroll without a configuration, and an error", got, err)
		}
	})
}

func TestSidecarCapture(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		edit        []func(*corev1.Pod)
		want        redirect.PodConfig
	}{
		{name: "defaults", want: sidecar(nil)},
		{
			name:        "as the injector writes them for a CNI plugin",
			annotations: map[string]string{AnnotationInterceptionMode: "REDIRECT", AnnotationIncludeOutboundRanges: "*", AnnotationIncludeInboundPorts: "*", AnnotationExcludeInboundPorts: "15020"},
			want:        sidecar(nil),
		},
		{
			name: "ranges",
			annotations: map[string]string{
				AnnotationIncludeOutboundRanges: "10.0.0.0/8, fd00::/8,",
				AnnotationExcludeOutboundRanges: "10.96.0.1/12,2001:db8::/32",
			},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.IncludeOutbound = redirect.Ranges{Prefixes: prefixes("10.0.0.0/8", "fd00::/8")}
				c.ExcludeOutbound = prefixes("10.96.0.0/12", "2001:db8::/32")
			}),
		},
		{
			name:        "empty lists capture nothing",
			annotations: map[string]string{AnnotationIncludeOutboundRanges: "", AnnotationIncludeInboundPorts: "", AnnotationExcludeInboundPorts: "", AnnotationExcludeOutboundPorts: ""},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.IncludeOutbound, c.IncludeInbound = redirect.Ranges{}, redirect.Ports{}
				c.ExcludeInboundPorts, c.ExcludeOutboundPorts = nil, nil
			}),
		},
		{
			name: "ports",
			annotations: map[string]string{
				AnnotationIncludeInboundPorts:  "8080, 9090",
				AnnotationExcludeInboundPorts:  "8081,0",
				AnnotationIncludeOutboundPorts: "32000",
				AnnotationExcludeOutboundPorts: "9100,15020",
			},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.IncludeInbound = redirect.Ports{Ports: []uint16{8080, 9090}}
				c.ExcludeInboundPorts = []uint16{8081}
				c.IncludeOutboundPorts = []uint16{32000}
				c.ExcludeOutboundPorts = []uint16{9100, 15020}
			}),
		},
		{
			name:        "status port is excluded inbound",
			annotations: map[string]string{AnnotationStatusPort: "15099"},
			want:        sidecar(func(c *redirect.SidecarConfig) { c.ExcludeInboundPorts = []uint16{15020, 15099} }),
		},
		{
			name:        "status port already excluded, as the injector writes it",
			annotations: map[string]string{AnnotationStatusPort: "15030", AnnotationExcludeInboundPorts: "15030"},
			want:        sidecar(func(c *redirect.SidecarConfig) { c.ExcludeInboundPorts = []uint16{15030} }),
		},
		{
			name:        "status port 0 is off",
			annotations: map[string]string{AnnotationStatusPort: "0"},
			want:        sidecar(nil),
		},
		{
			name:        "interfaces",
			annotations: map[string]string{AnnotationKubevirtInterfaces: "k6t-eth0", AnnotationExcludeInterfaces: "eth1, eth2"},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.RerouteInterfaces, c.ExcludeInterfaces = []string{"k6t-eth0"}, []string{"eth1", "eth2"}
			}),
		},
		{
			name:        "reroute-virtual-interfaces beats kubevirtInterfaces",
			annotations: map[string]string{AnnotationKubevirtInterfaces: "k6t-eth0", AnnotationRerouteVirtual: "tap0"},
			want:        sidecar(func(c *redirect.SidecarConfig) { c.RerouteInterfaces = []string{"tap0"} }),
		},
		{
			name: "the proxy's own UID and GID",
			edit: []func(*corev1.Pod){func(p *corev1.Pod) {
				p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](0)}
			}},
			want: sidecar(func(c *redirect.SidecarConfig) { c.ProxyUID = 1000 }),
		},
		{
			name: "no security context: 1337",
			edit: []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.Containers[1].SecurityContext = nil }},
			want: sidecar(nil),
		},
		{
			name: "DNS capture and invalid drop from the proxy's environment",
			edit: []func(*corev1.Pod){withProxyEnv(EnvDNSCapture, "true"), withProxyEnv(EnvInvalidDrop, "1")},
			want: sidecar(func(c *redirect.SidecarConfig) { c.DNSCapture, c.DropInvalid = true, true }),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := SidecarCapture(injectedPod(tt.annotations, tt.edit...))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want.Sidecar, got, cmpOpts...); diff != "" {
				t.Errorf("SidecarCapture() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSidecarCaptureRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		edit        []func(*corev1.Pod)
		want        string
	}{
		{"TPROXY", map[string]string{AnnotationInterceptionMode: "TPROXY"}, nil, "not supported by canopy-cni-agent"},
		{"NONE", map[string]string{AnnotationInterceptionMode: "NONE"}, nil, "unknown interception mode"},
		{"lower case mode", map[string]string{AnnotationInterceptionMode: "redirect"}, nil, "unknown interception mode"},
		{"bad CIDR", map[string]string{AnnotationIncludeOutboundRanges: "10.0.0.0/8,10.0.0.300/32"}, nil, "includeOutboundIPRanges"},
		{"address without length", map[string]string{AnnotationExcludeOutboundRanges: "10.0.0.1"}, nil, "excludeOutboundIPRanges"},
		{"wildcard exclusion", map[string]string{AnnotationExcludeOutboundRanges: "*"}, nil, "excludeOutboundIPRanges"},
		{"port out of range", map[string]string{AnnotationExcludeInboundPorts: "65536"}, nil, "excludeInboundPorts"},
		{"negative port", map[string]string{AnnotationIncludeInboundPorts: "-1"}, nil, "includeInboundPorts"},
		{"port range", map[string]string{AnnotationIncludeOutboundPorts: "8000-9000"}, nil, "includeOutboundPorts"},
		{"wildcard port exclusion", map[string]string{AnnotationExcludeOutboundPorts: "*"}, nil, "excludeOutboundPorts"},
		{"bad status port", map[string]string{AnnotationStatusPort: "x"}, nil, "status.sidecar.istio.io/port"},
		{"bad interface", map[string]string{AnnotationExcludeInterfaces: "eth0;rm"}, nil, "excludeInterfaces"},
		{"interface too long", map[string]string{AnnotationRerouteVirtual: "abcdefghijklmnop"}, nil, "reroute-virtual-interfaces"},
		{"bad DNS capture", nil, []func(*corev1.Pod){withProxyEnv(EnvDNSCapture, "maybe")}, "ISTIO_META_DNS_CAPTURE"},
		{"UID out of range", nil, []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Spec.Containers[1].SecurityContext.RunAsUser = ptr.To[int64](-5)
		}}, "runAsUser"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := SidecarCapture(injectedPod(tt.annotations, tt.edit...))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("SidecarCapture() = %+v, %v; want an error naming %q", got, err, tt.want)
			}
			if tt.name == "TPROXY" && !errors.Is(err, ErrUnsupported) {
				t.Errorf("error %v is not ErrUnsupported", err)
			}
		})
	}
}

// FuzzSidecarCapture: whatever the annotations and environment hold, the
// parser either refuses or returns a configuration the backends accept,
// and what it returns reads back the same when written out again.
func FuzzSidecarCapture(f *testing.F) {
	f.Add("REDIRECT", "*", "", "*", "15020", "", "", "15020", "", "", "", "false")
	f.Add("", "10.0.0.0/8,fd00::/8", "10.96.0.0/12", "8080,9090", "8081", "32000", "9100", "15021", "k6t-eth0", "eth1", "true", "true")
	f.Add("TPROXY", "*", "*", "*", "*", "*", "*", "", "", "", "", "")
	f.Add("", " 10.0.0.1/8 ,,", "::/0", "0,65535", "65536", "-1", "1.5", "0", "a,b", "lo", "1", "0")
	f.Add("", "127.0.0.0/8", "", "", "", "", "", "99999", "eth0;x", "", "maybe", "")
	f.Fuzz(func(t *testing.T, mode, inRanges, exRanges, inPorts, exPorts, inOutPorts, exOutPorts, status, reroute, exIfaces, dns, drop string) {
		annotations := map[string]string{}
		for k, v := range map[string]string{
			AnnotationInterceptionMode: mode, AnnotationIncludeOutboundRanges: inRanges, AnnotationExcludeOutboundRanges: exRanges,
			AnnotationIncludeInboundPorts: inPorts, AnnotationExcludeInboundPorts: exPorts,
			AnnotationIncludeOutboundPorts: inOutPorts, AnnotationExcludeOutboundPorts: exOutPorts,
			AnnotationStatusPort: status, AnnotationRerouteVirtual: reroute, AnnotationExcludeInterfaces: exIfaces,
		} {
			// An empty value stands for an absent annotation, but for the
			// lists, where both are worth trying.
			if v != "" || strings.Contains(k, "traffic.") {
				annotations[k] = v
			}
		}
		pod := injectedPod(annotations, withProxyEnv(EnvDNSCapture, dns), withProxyEnv(EnvInvalidDrop, drop))
		c, err := SidecarCapture(pod)
		if err != nil {
			if c != nil {
				t.Fatalf("an error (%v) with a configuration", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("SidecarCapture accepted what Validate refuses: %v", err)
		}
		again, err := SidecarCapture(pod)
		if err != nil || !again.Equal(c) {
			t.Fatalf("a second parse differs: %+v, %v", again, err)
		}
		// Written out and read back, the lists are the same.
		written := map[string]string{
			AnnotationIncludeOutboundRanges: joinRanges(c.IncludeOutbound),
			AnnotationExcludeOutboundRanges: joinPrefixes(c.ExcludeOutbound),
			AnnotationIncludeInboundPorts:   joinPortSet(c.IncludeInbound),
			AnnotationExcludeInboundPorts:   joinPorts(c.ExcludeInboundPorts),
			AnnotationIncludeOutboundPorts:  joinPorts(c.IncludeOutboundPorts),
			AnnotationExcludeOutboundPorts:  joinPorts(c.ExcludeOutboundPorts),
			AnnotationRerouteVirtual:        strings.Join(c.RerouteInterfaces, ","),
			AnnotationExcludeInterfaces:     strings.Join(c.ExcludeInterfaces, ","),
		}
		back, err := SidecarCapture(injectedPod(written, withProxyEnv(EnvDNSCapture, strconv.FormatBool(c.DNSCapture)), withProxyEnv(EnvInvalidDrop, strconv.FormatBool(c.DropInvalid))))
		if err != nil {
			t.Fatalf("the configuration written out does not parse: %v", err)
		}
		if !back.Equal(c) {
			t.Fatalf("written out and read back:\n%+v\nwant\n%+v", back, c)
		}
	})
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func joinRanges(r redirect.Ranges) string {
	if r.All {
		return "*"
	}
	return joinPrefixes(r.Prefixes)
}

func joinPorts(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func joinPortSet(p redirect.Ports) string {
	if p.All {
		return "*"
	}
	return joinPorts(p.Ports)
}

func TestOutsideMeshSidecars(t *testing.T) {
	t.Parallel()
	ns := func(name string, labels map[string]string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	namespaces := []*corev1.Namespace{
		ns("plain", nil),
		ns("injected", map[string]string{LabelInjection: "enabled"}),
		ns("not-injected", map[string]string{LabelInjection: "disabled"}),
		ns("revision", map[string]string{LabelRev: "canary"}),
		ns("opted-in", nil),
		ns("grpc", nil),
	}
	opted := injectedPod(nil, func(p *corev1.Pod) { p.Namespace = "opted-in" })
	proxyless := injectedPod(nil, withProxyEnv(EnvDisableEnvoy, "true"), func(p *corev1.Pod) { p.Namespace = "grpc" })
	pods := []*corev1.Pod{opted, proxyless}

	got := OutsideMesh(namespaces, pods, Config{SidecarCapture: true})
	if diff := cmp.Diff([]string{"grpc", "not-injected", "plain"}, got); diff != "" {
		t.Errorf("OutsideMesh() with sidecar capture mismatch (-want +got):\n%s", diff)
	}
	got = OutsideMesh(namespaces, pods, Config{})
	if diff := cmp.Diff([]string{"grpc", "injected", "not-injected", "opted-in", "plain", "revision"}, got); diff != "" {
		t.Errorf("OutsideMesh() without sidecar capture mismatch (-want +got):\n%s", diff)
	}
}
