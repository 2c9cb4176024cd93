package ambient

import (
	"testing"

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
		{name: "ingress use waypoint from namespace", in: ServiceInput{Service: testService("echo"), NamespaceLabels: map[string]string{LabelIngressUseWaypoint: "true"}}},
		{name: "service label overrides namespace ingress use waypoint", in: ServiceInput{
			Service:         testService("echo", func(s *corev1.Service) { s.Labels = map[string]string{LabelIngressUseWaypoint: "false"} }),
			NamespaceLabels: map[string]string{LabelIngressUseWaypoint: "true"},
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
