package ambient

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func TestBuildService(t *testing.T) {
	t.Parallel()
	waypoint := &workloadapi.GatewayAddress{
		Destination:   &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: []byte{10, 96, 0, 99}}},
		HboneMtlsPort: 15008,
	}
	for _, tt := range []struct {
		name string
		in   ServiceInput
		cfg  Config
	}{
		{name: "cluster IP with named and numbered targets", in: ServiceInput{Service: testService("echo")}},
		{name: "headless has no addresses", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
		})}},
		{name: "external name is not sent", in: ServiceInput{Service: testService("ext", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "db.example.com"
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		})}},
		{name: "dual stack", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:10:96::20"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		})}},
		{name: "ipv6 only", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:10:96::20", []string{"fd00:10:96::20"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		})}},
		{name: "no ip families is automatic", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) { s.Spec.IPFamilies = nil })}},
		{name: "internal traffic policy local", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		})}},
		{name: "prefer same zone", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameZone)
		})}},
		{name: "prefer close is prefer same zone", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
		})}},
		{name: "prefer same node", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
		})}},
		{name: "publish not ready addresses", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.PublishNotReadyAddresses = true
		})}},
		{name: "publish not ready with local policy", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.PublishNotReadyAddresses = true
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		})}},
		{name: "app protocols", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{
				{Name: "http-web", Port: 80},
				{Name: "grpc", Port: 81},
				{Name: "web", Port: 82, AppProtocol: ptr.To("kubernetes.io/h2c")},
				{Name: "http-but-declared-tcp", Port: 83, AppProtocol: ptr.To("tcp")},
				{Name: "http", Port: 84, Protocol: corev1.ProtocolUDP},
				{Name: "HTTP2", Port: 85},
			}
		})}},
		{name: "ingress use waypoint from namespace", in: ServiceInput{Service: testService("echo"), Waypoint: waypoint, NamespaceLabels: ReadLabels(map[string]string{LabelIngressUseWaypoint: "true"}, nil)}},
		{name: "service label overrides namespace ingress use waypoint", in: ServiceInput{
			Service:         testService("echo", func(s *corev1.Service) { s.Labels = map[string]string{LabelIngressUseWaypoint: "false"} }),
			Waypoint:        waypoint,
			NamespaceLabels: ReadLabels(map[string]string{LabelIngressUseWaypoint: "true"}, nil),
		}},
		{name: "service waypoint", in: ServiceInput{Service: testService("echo"), Waypoint: waypoint}},
		{name: "the service of a waypoint gets no waypoint", in: ServiceInput{Service: testService("waypoint", func(s *corev1.Service) {
			s.Labels = map[string]string{LabelManagedGateway: ManagedByMesh}
		}), Waypoint: waypoint}},
		{name: "exported to its own namespace", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Annotations = map[string]string{AnnotationExportTo: "."}
		})}},
		{name: "exported to no namespace is not sent", in: ServiceInput{Service: testService("echo", func(s *corev1.Service) {
			s.Annotations = map[string]string{AnnotationExportTo: "~"}
		})}},
		{name: "mesh default export", in: ServiceInput{Service: testService("echo")}, cfg: Config{DefaultExportTo: []string{"."}}},
		{name: "network and domain", in: ServiceInput{Service: testService("echo")}, cfg: Config{Network: "net-1", DomainSuffix: "corp.local"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkGolden(t, "service/"+golden(tt.name), BuildService(tt.in, tt.cfg))
		})
	}
}

// TestServiceLoadBalancing checks load_balancing: internalTrafficPolicy
// Local first, then a known spec.trafficDistribution, then the
// networking.istio.io/traffic-distribution annotation of the Service,
// then of its namespace; publishNotReadyAddresses adds ALLOW_ALL.
func TestServiceLoadBalancing(t *testing.T) {
	t.Parallel()
	zone := &workloadapi.LoadBalancing{
		RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE},
		Mode:              workloadapi.LoadBalancing_FAILOVER,
	}
	node := &workloadapi.LoadBalancing{
		RoutingPreference: []workloadapi.LoadBalancing_Scope{
			workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
			workloadapi.LoadBalancing_SUBZONE, workloadapi.LoadBalancing_NODE,
		},
		Mode: workloadapi.LoadBalancing_FAILOVER,
	}
	annotated := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationTrafficDistribution: v} }
	}
	nsAnnotation := func(v string) map[string]string { return map[string]string{AnnotationTrafficDistribution: v} }
	for _, tt := range []struct {
		name  string
		svc   *corev1.Service
		nsAnn map[string]string
		want  *workloadapi.LoadBalancing
	}{
		{name: "nothing set", svc: testService("echo")},
		{name: "service annotation", svc: testService("echo", annotated("PreferSameZone")), want: zone},
		{name: "service annotation, any case", svc: testService("echo", annotated("prefersamenode")), want: node},
		{name: "older spelling", svc: testService("echo", annotated("PreferClose")), want: zone},
		{name: "namespace annotation", svc: testService("echo"), nsAnn: nsAnnotation("PreferSameNode"), want: node},
		{name: "service annotation over namespace's", svc: testService("echo", annotated("PreferSameZone")), nsAnn: nsAnnotation("PreferSameNode"), want: zone},
		{name: "unknown service annotation means any", svc: testService("echo", annotated("Elsewhere")), nsAnn: nsAnnotation("PreferSameNode")},
		{name: "spec over annotations", svc: testService("echo", annotated("PreferSameZone"), func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
		}), want: node},
		{name: "unknown spec value falls back to annotations", svc: testService("echo", func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr.To("Elsewhere")
		}), nsAnn: nsAnnotation("PreferSameZone"), want: zone},
		{name: "local traffic policy over annotations", svc: testService("echo", annotated("PreferSameZone"), func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}), want: &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE},
			Mode:              workloadapi.LoadBalancing_STRICT,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := BuildService(ServiceInput{Service: tt.svc, NamespaceAnnotations: ReadLabels(tt.nsAnn, nil)}, Config{}).GetLoadBalancing()
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("load_balancing mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIngressUseWaypoint checks ingress_use_waypoint: the label of the
// Service or ServiceEntry, else of its namespace, read as a boolean, and
// only for one bound to a waypoint.
func TestIngressUseWaypoint(t *testing.T) {
	t.Parallel()
	waypoint := &workloadapi.GatewayAddress{
		Destination:   &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: []byte{10, 96, 0, 99}}},
		HboneMtlsPort: 15008,
	}
	label := func(v string) map[string]string { return map[string]string{LabelIngressUseWaypoint: v} }
	for _, tt := range []struct {
		name         string
		lbls, nsLbls map[string]string
		waypoint     *workloadapi.GatewayAddress
		want         bool
	}{
		{name: "label without a waypoint", lbls: label("true")},
		{name: "namespace label without a waypoint", nsLbls: label("true")},
		{name: "label with a waypoint", lbls: label("true"), waypoint: waypoint, want: true},
		{name: "namespace label with a waypoint", nsLbls: label("true"), waypoint: waypoint, want: true},
		{name: "other spellings of true", lbls: label("T"), waypoint: waypoint, want: true},
		{name: "own label, even empty, over the namespace's", lbls: label(""), nsLbls: label("true"), waypoint: waypoint},
		{name: "not a boolean", lbls: label("yes"), waypoint: waypoint},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := testService("echo", func(s *corev1.Service) { s.Labels = tt.lbls })
			if got := BuildService(ServiceInput{Service: svc, Waypoint: tt.waypoint, NamespaceLabels: ReadLabels(tt.nsLbls, nil)}, Config{}).GetIngressUseWaypoint(); got != tt.want {
				t.Errorf("Service ingress_use_waypoint = %v, want %v", got, tt.want)
			}
			se := serviceEntry(func(se *networkingv1.ServiceEntry) { se.Labels = tt.lbls })
			svcs, _ := BuildServiceEntry(ServiceEntryInput{ServiceEntry: se, Waypoint: tt.waypoint, NamespaceLabels: ReadLabels(tt.nsLbls, nil)}, Config{})
			if got := svcs[0].GetIngressUseWaypoint(); got != tt.want {
				t.Errorf("ServiceEntry ingress_use_waypoint = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestServiceEntryLoadBalancing checks a ServiceEntry's load_balancing:
// PASSTHROUGH and ALLOW_ALL for resolution NONE, else the
// networking.istio.io/traffic-distribution annotation of the entry, then
// of its namespace.
func TestServiceEntryLoadBalancing(t *testing.T) {
	t.Parallel()
	zone := &workloadapi.LoadBalancing{
		RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE},
		Mode:              workloadapi.LoadBalancing_FAILOVER,
	}
	for _, tt := range []struct {
		name       string
		resolution networkingapi.ServiceEntry_Resolution
		ann, nsAnn map[string]string
		want       *workloadapi.LoadBalancing
	}{
		{name: "static", resolution: networkingapi.ServiceEntry_STATIC},
		{name: "none passes through", resolution: networkingapi.ServiceEntry_NONE, ann: map[string]string{AnnotationTrafficDistribution: "PreferSameZone"},
			want: &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH, HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}},
		{name: "annotation", resolution: networkingapi.ServiceEntry_DNS, ann: map[string]string{AnnotationTrafficDistribution: "PreferSameZone"}, want: zone},
		{name: "namespace annotation", resolution: networkingapi.ServiceEntry_STATIC, nsAnn: map[string]string{AnnotationTrafficDistribution: "PreferClose"}, want: zone},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			se := serviceEntry(func(se *networkingv1.ServiceEntry) {
				se.Spec.Resolution = tt.resolution
				se.Annotations = tt.ann
			})
			svcs, _ := BuildServiceEntry(ServiceEntryInput{ServiceEntry: se, NamespaceAnnotations: ReadLabels(tt.nsAnn, nil)}, Config{})
			for _, s := range svcs {
				if diff := cmp.Diff(tt.want, s.GetLoadBalancing(), protocmp.Transform()); diff != "" {
					t.Errorf("%s load_balancing mismatch (-want +got):\n%s", s.GetHostname(), diff)
				}
			}
		})
	}
}
