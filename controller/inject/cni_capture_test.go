package inject

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
)

// TestCNIAgentCaptures: what the injector writes for a CNI plugin is what
// canopy-cni-agent reads. Each injected pod goes through the agent's own
// decision (cni/enroll), which must capture it with the settings its
// annotations asked the injector for; pods that install their own capture
// (istio-init) or have no Envoy (grpc-agent) must be left alone. The test
// imports the agent's package only to hold the two to one contract; the
// injector itself never links it.
func TestCNIAgentCaptures(t *testing.T) {
	t.Parallel()
	cni := func(c *Config) { c.CNI = true }
	sidecar := func(f func(*redirect.SidecarConfig)) *redirect.SidecarConfig {
		c := redirect.DefaultSidecarConfig()
		if f != nil {
			f(c)
		}
		return c
	}
	for _, tt := range []struct {
		name   string
		mod    []func(*corev1.Pod, *Config)
		want   *redirect.SidecarConfig // nil: not captured
		reason string                  // why not, when want is nil
	}{
		{name: "default", mod: []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c) }}, want: sidecar(nil)},
		{name: "native sidecar", mod: []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c); c.NativeSidecars = true }}, want: sidecar(nil)},
		{
			name: "traffic annotations",
			mod: []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c) }, annotated(
				AnnotationIncludeOutboundRanges, "10.0.0.0/8",
				AnnotationExcludeOutboundRanges, "10.96.0.1/32",
				AnnotationIncludeInboundPorts, "9080",
				AnnotationExcludeInboundPorts, "9090",
				AnnotationIncludeOutboundPorts, "443",
				AnnotationExcludeOutboundPorts, "3306,5432")},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.IncludeOutbound = redirect.Ranges{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
				c.ExcludeOutbound = []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")}
				c.IncludeInbound = redirect.Ports{Ports: []uint16{9080}}
				c.ExcludeInboundPorts = []uint16{9090, 15020}
				c.IncludeOutboundPorts = []uint16{443}
				c.ExcludeOutboundPorts = []uint16{3306, 5432}
			}),
		},
		{
			name: "status port and interfaces",
			mod: []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c) }, annotated(
				AnnotationStatusPort, "15030",
				AnnotationRerouteInterfaces, "tap0",
				AnnotationExcludeInterfaces, "eth1")},
			want: sidecar(func(c *redirect.SidecarConfig) {
				c.ExcludeInboundPorts = []uint16{15030}
				c.RerouteInterfaces, c.ExcludeInterfaces = []string{"tap0"}, []string{"eth1"}
			}),
		},
		{
			name: "DNS capture in the proxy's metadata",
			mod: []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c) }, annotated(
				AnnotationProxyConfig, "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n")},
			want: sidecar(func(c *redirect.SidecarConfig) { c.DNSCapture = true }),
		},
		{name: "istio-init installs its own", reason: "istio-init"},
		{
			name:   "proxyless gRPC",
			mod:    []func(*corev1.Pod, *Config){func(_ *corev1.Pod, c *Config) { cni(c) }, annotated(AnnotationTemplates, TemplateGRPCAgent)},
			reason: "proxyless",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod, cfg := testPod(), testConfig()
			for _, m := range tt.mod {
				m(pod, &cfg)
			}
			injected, err := Mutate(pod, cfg)
			if err != nil {
				t.Fatal(err)
			}
			d, err := enroll.Decide(injected, nil, enroll.Config{SidecarCapture: true})
			if err != nil {
				t.Fatalf("the agent refuses the injected pod: %v", err)
			}
			if tt.want == nil {
				if d.Enroll || !strings.Contains(d.Reason, tt.reason) {
					t.Fatalf("Decide() = %+v, want not captured because of %s", d, tt.reason)
				}
				return
			}
			if !d.Enroll || d.Pod.Sidecar == nil {
				t.Fatalf("Decide() = %+v, want the sidecar capture", d)
			}
			if diff := cmp.Diff(tt.want, d.Pod.Sidecar, cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("capture (-want +got):\n%s", diff)
			}
		})
	}
}
