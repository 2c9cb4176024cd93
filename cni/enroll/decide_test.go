package enroll

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/cni/redirect"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	cfg := Config{SystemNamespace: "istio-system", ExcludedNamespaces: []string{"kube-system"}, DNSCapture: true}
	ambientNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps", Labels: map[string]string{LabelDataplaneMode: ModeAmbient}}}
	plainNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}
	pod := func(ns string, labels, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels, Annotations: annotations}}
	}
	def := redirect.DefaultPodConfig()
	noDNS := def
	noDNS.DNSCapture = false
	outboundOnly := def
	outboundOnly.InboundCapture = false
	reroute := def
	reroute.RerouteInterfaces = []string{"tap0", "k6t-eth0"}
	hostNet := pod("apps", nil, nil)
	hostNet.Spec.HostNetwork = true

	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		ns   *corev1.Namespace
		want Decision
	}{
		{"namespace label", pod("apps", nil, nil), ambientNS, Decision{Enroll: true, Reason: "ambient", Pod: def}},
		{"pod label", pod("apps", map[string]string{LabelDataplaneMode: ModeAmbient}, nil), plainNS, Decision{Enroll: true, Reason: "ambient", Pod: def}},
		{"pod label, unknown namespace", pod("apps", map[string]string{LabelDataplaneMode: ModeAmbient}, nil), nil, Decision{Enroll: true, Reason: "ambient", Pod: def}},
		{"opt out", pod("apps", map[string]string{LabelDataplaneMode: ModeNone}, nil), ambientNS, Decision{Reason: "pod opted out (istio.io/dataplane-mode=none)"}},
		{"no label", pod("apps", nil, nil), plainNS, Decision{Reason: "neither pod nor namespace has istio.io/dataplane-mode=ambient"}},
		{"host network", hostNet, ambientNS, Decision{Reason: "host-network pod"}},
		{"sidecar, capture off", pod("apps", nil, map[string]string{AnnotationSidecarStatus: "{}"}), ambientNS, Decision{Reason: "pod has a sidecar"}},
		{"node proxy", pod("istio-system", map[string]string{"app": "ztunnel", LabelDataplaneMode: ModeAmbient}, nil), nil, Decision{Reason: "node proxy pod"}},
		{"excluded namespace", pod("kube-system", map[string]string{LabelDataplaneMode: ModeAmbient}, nil), nil, Decision{Reason: "namespace kube-system is excluded"}},
		{"dns capture off", pod("apps", nil, map[string]string{AnnotationDNSCapture: "false"}), ambientNS, Decision{Enroll: true, Reason: "ambient", Pod: noDNS}},
		{"ingress mode", pod("apps", nil, map[string]string{AnnotationBypassInbound: "true"}), ambientNS, Decision{Enroll: true, Reason: "ambient", Pod: outboundOnly}},
		{"reroute interfaces", pod("apps", nil, map[string]string{AnnotationRerouteVirtual: "tap0, k6t-eth0,"}), ambientNS, Decision{Enroll: true, Reason: "ambient", Pod: reroute}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decide(tt.pod, tt.ns, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutsideMesh(t *testing.T) {
	t.Parallel()
	cfg := Config{SystemNamespace: "istio-system", ExcludedNamespaces: []string{"kube-system"}}
	ns := func(name, mode string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if mode != "" {
			n.Labels = map[string]string{LabelDataplaneMode: mode}
		}
		return n
	}
	pod := func(namespace, mode string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: namespace}}
		if mode != "" {
			p.Labels = map[string]string{LabelDataplaneMode: mode}
		}
		return p
	}
	for _, tt := range []struct {
		name       string
		namespaces []*corev1.Namespace
		pods       []*corev1.Pod
		want       []string
	}{
		{name: "nothing"},
		{
			name:       "ambient namespaces are in, others out, sorted",
			namespaces: []*corev1.Namespace{ns("web", ""), ns("mesh", ModeAmbient), ns("db", ModeNone), ns("api", "")},
			want:       []string{"api", "db", "web"},
		},
		{
			name:       "a pod enrolled by its own label keeps its namespace in",
			namespaces: []*corev1.Namespace{ns("web", ""), ns("api", "")},
			pods:       []*corev1.Pod{pod("web", ModeAmbient), pod("api", ""), pod("api", ModeNone)},
			want:       []string{"api"},
		},
		{
			name:       "pods opting out do not take an ambient namespace out",
			namespaces: []*corev1.Namespace{ns("mesh", ModeAmbient)},
			pods:       []*corev1.Pod{pod("mesh", ModeNone)},
		},
		{
			name:       "excluded namespaces are out whatever their labels",
			namespaces: []*corev1.Namespace{ns("kube-system", ModeAmbient)},
			pods:       []*corev1.Pod{pod("kube-system", ModeAmbient)},
			want:       []string{"kube-system"},
		},
		{
			name:       "a pod of an unknown namespace changes nothing",
			namespaces: []*corev1.Namespace{ns("web", "")},
			pods:       []*corev1.Pod{pod("gone", ModeAmbient)},
			want:       []string{"web"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := OutsideMesh(tt.namespaces, tt.pods, cfg)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("OutsideMesh() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecidePortSysctls: an ambient pod whose own
// net.ipv4.ip_local_reserved_ports, which the runtime writes after the
// agent's, would leave one of the node proxy's ports to the kernel's
// choice is refused; its port range alone is not a reason, nor are
// sysctls of pods outside the mesh.
func TestDecidePortSysctls(t *testing.T) {
	t.Parallel()
	cfg := Config{SystemNamespace: "istio-system", DNSCapture: true}
	ambientNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps", Labels: map[string]string{LabelDataplaneMode: ModeAmbient}}}
	pod := func(mode string, sysctls ...corev1.Sysctl) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "apps", Labels: map[string]string{LabelDataplaneMode: mode}}}
		if sysctls != nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: sysctls}
		}
		return p
	}
	rng := func(v string) corev1.Sysctl { return corev1.Sysctl{Name: SysctlPortRange, Value: v} }
	res := func(v string) corev1.Sysctl { return corev1.Sysctl{Name: SysctlReservedPorts, Value: v} }
	for _, tt := range []struct {
		name    string
		pod     *corev1.Pod
		wantErr string
	}{
		{"no sysctls", pod(ModeAmbient), ""},
		{"a range over the proxy's ports, the agent's reservation kept", pod(ModeAmbient, rng("15000 15100")), ""},
		{"a reservation of the pod's, the default range", pod(ModeAmbient, res("8080")), ""},
		{"a reservation that leaves the proxy's ports in the range", pod(ModeAmbient, rng("15000 15100"), res("15001,15006")), "leaves [15008 15053]"},
		{"the same, slashes", pod(ModeAmbient, corev1.Sysctl{Name: "net/ipv4/ip_local_port_range", Value: "15000 15100"}, corev1.Sysctl{Name: "net/ipv4/ip_local_reserved_ports", Value: ""}), "leaves [15001 15006 15008 15053]"},
		{"a reservation that covers them", pod(ModeAmbient, rng("15000 15100"), res("15001,15006-15008,15053")), ""},
		{"malformed", pod(ModeAmbient, rng("15000"), res("")), "want two ports"},
		{"outside the mesh", pod(ModeNone, rng("15000 15100"), res("")), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Decide(tt.pod, ambientNS, cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Decide() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !d.Enroll {
				t.Errorf("Decide() = %+v, %v; want Enroll and an error containing %q", d, err, tt.wantErr)
			}
		})
	}
}
