package ambient

import (
	"testing"
	"time"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// testPod is an enrolled, Ready pod of Deployment "echo" on node-1.
func testPod(mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:         "echo-7d9c4-x2x9q",
			GenerateName: "echo-7d9c4-",
			Namespace:    "shop",
			Labels:       map[string]string{"app": "echo", "version": "v2", "pod-template-hash": "7d9c4"},
			Annotations:  map[string]string{AnnotationRedirection: "enabled"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "echo-7d9c4", Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:           "node-1",
			ServiceAccountName: "echo",
			Containers: []corev1.Container{{
				Name:  "echo",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}},
			}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      "10.244.1.7",
			PodIPs:     []corev1.PodIP{{IP: "10.244.1.7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func testNode() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{
		corev1.LabelTopologyRegion: "eu-west", corev1.LabelTopologyZone: "eu-west-1a", LabelSubzone: "rack-3",
	}}}
}

func testService(name string, mods ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": "echo"},
			ClusterIP:  "10.96.0.20",
			ClusterIPs: []string{"10.96.0.20"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("http")},
				{Name: "tcp-admin", Port: 9000, TargetPort: intstr.FromInt32(9090)},
			},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func TestBuildPodWorkload(t *testing.T) {
	t.Parallel()
	now := metav1.NewTime(time.Unix(1700000000, 0))
	waypoint := &workloadapi.GatewayAddress{
		Destination:   &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "shop", Hostname: "waypoint.shop.svc.cluster.local"}},
		HboneMtlsPort: 15008,
	}
	for _, tt := range []struct {
		name string
		in   PodInput
		cfg  Config
	}{
		{name: "enrolled ready pod with node and service", in: PodInput{Pod: testPod(), NodeLabels: ReadLabels(testNode().Labels, nil), Services: []*corev1.Service{testService("echo")}}},
		{name: "not enrolled is plain TCP", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Annotations = nil })}},
		{name: "redirection pending is plain TCP", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Annotations[AnnotationRedirection] = "pending" })}},
		{name: "tunnel label is native HBONE", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Annotations = nil
			p.Labels[LabelTunnel] = "http"
		})}},
		{name: "tunnel label list", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Labels[LabelTunnel] = "http3,http" })}},
		{name: "not ready is unhealthy", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse })}},
		{name: "no ready condition is unhealthy", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Status.Conditions = nil })}},
		{name: "terminating is unhealthy", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.DeletionTimestamp = &now })}},
		{name: "succeeded is not sent", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })}},
		{name: "failed is not sent", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })}},
		{name: "no IP is not sent", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Status.PodIP, p.Status.PodIPs, p.Status.Phase = "", nil, corev1.PodPending
		})}},
		{name: "podIP without podIPs", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Status.PodIPs = nil })}},
		{name: "dual stack", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00:10:244:1::7"}}
		})}},
		{name: "host network", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Status.PodIPs = []corev1.PodIP{{IP: "10.99.0.11"}}
		})}},
		{name: "named target port missing on pod", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }),
			Services: []*corev1.Service{testService("echo")}}},
		{name: "named target port needs matching protocol", in: PodInput{Pod: testPod(), Services: []*corev1.Service{testService("dns", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{
				{Name: "dns-udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("dns")},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("dns")},
			}
		})}}},
		{name: "unset target port is the service port", in: PodInput{Pod: testPod(), Services: []*corev1.Service{testService("plain", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Port: 7070}}
		})}}},
		{name: "pod behind several services", in: PodInput{Pod: testPod(), Services: []*corev1.Service{
			testService("echo"), testService("echo-canary"), testService("echo-headless", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
		}}},
		{name: "external name service is ignored", in: PodInput{Pod: testPod(), Services: []*corev1.Service{testService("ext", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
		})}}},
		{name: "canonical labels win", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Labels[LabelCanonicalName] = "checkout"
			p.Labels[LabelCanonicalRevision] = "r42"
			p.Labels[LabelAppName] = "ignored"
		})}},
		{name: "app.kubernetes.io labels over app and version", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Labels[LabelAppName] = "echo-app"
			p.Labels[LabelAppVersion] = "1.2.3"
		})}},
		{name: "canonical fallback to workload name and latest", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Labels = map[string]string{"pod-template-hash": "7d9c4"}
		})}},
		// A StatefulSet names its pods: istiod's GetDeployMetaFromPod reads
		// the owner only of pods with generateName.
		{name: "statefulset owner", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Name, p.GenerateName = "db-0", ""
			p.Labels = nil
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "StatefulSet", Name: "db", Controller: ptr.To(true)}}
		})}},
		{name: "bare pod", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Labels, p.OwnerReferences = nil, nil
		})}},
		{name: "default service account is sent as is", in: PodInput{Pod: testPod(func(p *corev1.Pod) { p.Spec.ServiceAccountName = "default" })}},
		{name: "custom cluster network and trust domain", in: PodInput{Pod: testPod()},
			cfg: Config{ClusterID: "east", Network: "net-1", TrustDomain: "example.org"}},
		{name: "node without topology labels", in: PodInput{Pod: testPod(), NodeLabels: ReadLabels(map[string]string{"kubernetes.io/hostname": "node-1"}, nil)}},
		{name: "workload waypoint", in: PodInput{Pod: testPod(), Waypoint: waypoint}},
		{name: "waypoint pod never gets a waypoint", in: PodInput{Pod: testPod(func(p *corev1.Pod) {
			p.Labels[LabelManagedGateway] = ManagedByMesh
			p.Labels[LabelTunnel] = "http"
		}), Waypoint: waypoint}},
		{name: "selected by a service entry", in: PodInput{Pod: testPod(), ServiceEntries: []*networkingv1.ServiceEntry{func() *networkingv1.ServiceEntry {
			se := serviceEntry()
			se.Spec.Ports = append(se.Spec.Ports, &networkingapi.ServicePort{Number: 9000, Name: "metrics"})
			return se
		}()}}},
		{name: "policies sorted and unique", in: PodInput{Pod: testPod(), Policies: []string{"shop/deny-b", "shop/allow-a", "shop/deny-b"}}},
		// istiod's buildWorkloadPolicies: the sorted AuthorizationPolicy
		// keys, then the PeerAuthentication's converted policy.
		{name: "mtls policy after the sorted policies", in: PodInput{Pod: testPod(), Policies: []string{"shop/deny-b", "istio-system/root"},
			MTLSPolicy: "istio-system/istio_converted_static_strict"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := BuildPodWorkload(tt.in, tt.cfg)
			checkGolden(t, "pod/"+golden(tt.name), got)
		})
	}
}

// golden turns a case name into a file name.
func golden(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c == ' ' {
			b[i] = '-'
		}
	}
	return string(b)
}

func TestBuildPodWorkloadDoesNotModifyInput(t *testing.T) {
	t.Parallel()
	pod, svc, node := testPod(), testService("echo"), testNode()
	nodeLabels := node.DeepCopy().Labels
	in := PodInput{Pod: pod.DeepCopy(), Services: []*corev1.Service{svc.DeepCopy()}, NodeLabels: ReadLabels(nodeLabels, nil), Policies: []string{"b", "a"}}
	BuildPodWorkload(in, Config{})
	if !equalObjects(pod, in.Pod) || !equalObjects(svc, in.Services[0]) || !equalObjects(node.Labels, nodeLabels) || in.Policies[0] != "b" {
		t.Error("BuildPodWorkload modified its input")
	}
}

func equalObjects(a, b any) bool { return cmpEqual(a, b) }
