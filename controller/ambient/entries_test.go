package ambient

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func serviceEntry(mods ...func(*networkingv1.ServiceEntry)) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: "shop"}}
	se.Spec.Hosts = []string{"payments.example.com"}
	se.Spec.Addresses = []string{"240.0.0.5"}
	se.Spec.Ports = []*networkingapi.ServicePort{
		{Number: 443, Name: "https", Protocol: "TLS"},
		{Number: 80, Name: "http", Protocol: "HTTP", TargetPort: 8080},
	}
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	for _, m := range mods {
		m(se)
	}
	return se
}

// autoAllocated is a ServiceEntry without addresses whose status holds
// allocated ones, for a host and a wildcard host.
func autoAllocated(resolution networkingapi.ServiceEntry_Resolution, mods ...func(*networkingv1.ServiceEntry)) *networkingv1.ServiceEntry {
	return serviceEntry(append([]func(*networkingv1.ServiceEntry){func(se *networkingv1.ServiceEntry) {
		se.Spec.Addresses = nil
		se.Spec.Hosts = []string{"api.example.com", "*.cdn.example.com"}
		se.Spec.Resolution = resolution
		se.Status.Addresses = []*networkingapi.ServiceEntryAddress{
			{Host: "api.example.com", Value: "240.240.12.7"},
			{Host: "api.example.com", Value: "2001:2::f:7"},
			{Host: "*.cdn.example.com", Value: "240.240.3.3"},
			{Host: "old.example.com", Value: "240.240.9.9"},
			{Host: "api.example.com", Value: "not-an-ip"},
		}
	}}, mods...)...)
}

// entriesResult puts a builder's several outputs in one message for a
// golden file: Services then Workloads, as Addresses.
type entriesResult struct {
	services  []*workloadapi.Service
	workloads []*workloadapi.Workload
}

func checkEntries(t *testing.T, name string, r entriesResult) {
	t.Helper()
	for i, s := range r.services {
		checkGolden(t, name+"/service-"+string(rune('0'+i)), s)
	}
	for i, w := range r.workloads {
		checkGolden(t, name+"/workload-"+string(rune('0'+i)), w)
	}
}

func TestBuildServiceEntry(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		se   *networkingv1.ServiceEntry
		in   ServiceEntryInput // its ServiceEntry is se
	}{
		{"hosts without endpoints", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Hosts = append(se.Spec.Hosts, "pay.example.com")
			se.Spec.SubjectAltNames = []string{"spiffe://example.com/payments"}
		}), ServiceEntryInput{}},
		{"cidr address", serviceEntry(func(se *networkingv1.ServiceEntry) { se.Spec.Addresses = []string{"240.0.0.0/24", "2001:db8::/64"} }), ServiceEntryInput{}},
		{"inline endpoints", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Endpoints = []*networkingapi.WorkloadEntry{
				{Address: "10.10.0.5", Ports: map[string]uint32{"https": 8443}, Labels: map[string]string{"app": "pay", LabelTunnel: "http"},
					ServiceAccount: "pay", Locality: "eu/eu-1", Weight: 3},
				{Address: "10.10.0.6", Network: "vm-net"},
			}
		}), ServiceEntryInput{}},
		{"exported to its own namespace", serviceEntry(func(se *networkingv1.ServiceEntry) { se.Spec.ExportTo = []string{"."} }), ServiceEntryInput{}},
		{"exported to no namespace keeps its endpoints", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.ExportTo = []string{"~"}
			se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.0.5"}}
		}), ServiceEntryInput{}},
		{"dns endpoint uses hostname", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Resolution = networkingapi.ServiceEntry_DNS
			se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "pay-1.example.com"}}
		}), ServiceEntryInput{}},
		// istiod's serviceEntryWorkloadBuilder: a DNS-resolved entry without
		// endpoints or workloadSelector gets one workload per host, addressed
		// by the host name; inline endpoints list the policies that select
		// the ServiceEntry's labels (buildWorkloadPolicies), the converted
		// PeerAuthentication last, and take their canonical names and tunnel
		// from the ServiceEntry's labels.
		{"dns resolution without endpoints has a workload per host", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Labels = map[string]string{"app": "payments-api", "version": "v3"}
			se.Spec.Hosts = append(se.Spec.Hosts, "pay.example.com")
			se.Spec.Resolution = networkingapi.ServiceEntry_DNS
		}), ServiceEntryInput{Policies: []string{"shop/allow-pay"}, MTLSPolicy: "istio-system/istio_converted_static_strict"}},
		// istiod's constructServiceEntries reads status.addresses (written by
		// its IP allocator) for the hosts of an entry without addresses whose
		// resolution is not NONE, unless the entry opts out
		// (ShouldV2AutoAllocateIP); a wildcard host only with DYNAMIC_DNS.
		{"auto-allocated addresses from status", autoAllocated(networkingapi.ServiceEntry_DNS), ServiceEntryInput{}},
		{"auto-allocated wildcard with dynamic dns", autoAllocated(networkingapi.ServiceEntry_DYNAMIC_DNS), ServiceEntryInput{}},
		{"auto-allocation opted out", autoAllocated(networkingapi.ServiceEntry_DNS, func(se *networkingv1.ServiceEntry) {
			se.Labels = map[string]string{LabelEnableAutoallocateIP: "False"}
		}), ServiceEntryInput{}},
		{"auto-allocation not for resolution none", autoAllocated(networkingapi.ServiceEntry_NONE), ServiceEntryInput{}},
		{"spec addresses over status", autoAllocated(networkingapi.ServiceEntry_DNS, func(se *networkingv1.ServiceEntry) {
			se.Spec.Addresses = []string{"240.0.0.9"}
		}), ServiceEntryInput{}},
		{"dynamic dns resolution without endpoints", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Resolution = networkingapi.ServiceEntry_DYNAMIC_DNS
		}), ServiceEntryInput{}},
		{"inline endpoints carry their policies", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Labels = map[string]string{"app": "payments-api", LabelTunnel: "http"}
			se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.0.5", Labels: map[string]string{"app": "ignored"}}}
		}), ServiceEntryInput{Policies: []string{"shop/deny-b", "istio-system/allow-a"}, MTLSPolicy: "istio-system/istio_converted_static_strict"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := tt.in
			in.ServiceEntry = tt.se
			svcs, wls := BuildServiceEntry(in, Config{})
			checkEntries(t, "serviceentry/"+golden(tt.name), entriesResult{svcs, wls})
		})
	}
	for _, tt := range []struct {
		name string
		se   *networkingv1.ServiceEntry
	}{
		{"static resolution", serviceEntry()},
		{"none resolution", serviceEntry(func(se *networkingv1.ServiceEntry) { se.Spec.Resolution = networkingapi.ServiceEntry_NONE })},
		{"dns resolution selecting workloads", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Resolution = networkingapi.ServiceEntry_DNS
			se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "pay"}}
		})},
		{"dns resolution exported to no namespace", serviceEntry(func(se *networkingv1.ServiceEntry) {
			se.Spec.Resolution = networkingapi.ServiceEntry_DNS
			se.Spec.ExportTo = []string{"~"}
		})},
	} {
		if _, wls := BuildServiceEntry(ServiceEntryInput{ServiceEntry: tt.se}, Config{}); len(wls) != 0 {
			t.Errorf("%s without endpoints: %d workloads, want none", tt.name, len(wls))
		}
	}
}

func TestBuildWorkloadEntry(t *testing.T) {
	t.Parallel()
	we := func(mods ...func(*networkingv1.WorkloadEntry)) *networkingv1.WorkloadEntry {
		w := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "shop"}}
		w.Spec.Address = "10.10.1.1"
		w.Spec.Labels = map[string]string{"app": "payments", "version": "v1"}
		w.Spec.ServiceAccount = "payments"
		w.Spec.Ports = map[string]uint32{"https": 9443}
		for _, m := range mods {
			m(w)
		}
		return w
	}
	for _, tt := range []struct {
		name string
		in   WorkloadEntryInput
	}{
		{"vm behind a service entry", WorkloadEntryInput{WorkloadEntry: we(), ServiceEntries: []*networkingv1.ServiceEntry{serviceEntry()}, Policies: []string{"shop/p"}}},
		// istiod's constructServicesFromWorkloadEntry: a named target port is
		// the entry's port of that name (left out without one); another port
		// is the entry's port named like the Service port, else the number.
		{"selected by a kubernetes service", WorkloadEntryInput{WorkloadEntry: we(func(w *networkingv1.WorkloadEntry) {
			w.Spec.Ports = map[string]uint32{"https": 9443, "http": 8081}
		}), Services: []*corev1.Service{testService("payments", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{
				{Name: "tls", Port: 443, TargetPort: intstr.FromString("https")},
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics")},
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "admin", Port: 9000, TargetPort: intstr.FromInt32(9001)},
				{Name: "unset", Port: 7000},
			}
		}), testService("ext", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })}}},
		{"auto-registered by a workload group with locality and weight", WorkloadEntryInput{WorkloadEntry: we(func(w *networkingv1.WorkloadEntry) {
			w.Annotations = map[string]string{AnnotationAutoRegistrationGroup: "payments-vms"}
			w.OwnerReferences = []metav1.OwnerReference{{Kind: "WorkloadGroup", Name: "payments-vms"}}
			w.Spec.Locality = "us-east/us-east-1b/rack-9"
			w.Spec.Weight = 10
			w.Spec.Network = "vm-net"
		})}},
		{"hostname address", WorkloadEntryInput{WorkloadEntry: we(func(w *networkingv1.WorkloadEntry) { w.Spec.Address = "vm-1.corp.example" })}},
		{"tunnel label", WorkloadEntryInput{WorkloadEntry: we(func(w *networkingv1.WorkloadEntry) { w.Spec.Labels[LabelTunnel] = "http" })}},
		// istiod merges the spec's labels with the object's, the object's
		// winning (ConvertClientWorkloadEntry).
		{"object labels over spec labels", WorkloadEntryInput{WorkloadEntry: we(func(w *networkingv1.WorkloadEntry) {
			w.Labels = map[string]string{"version": "v2", LabelWorkloadName: "payments"}
		})}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkGolden(t, "workloadentry/"+golden(tt.name), BuildWorkloadEntry(tt.in, Config{}))
		})
	}
}

func TestBuildEndpointSliceWorkloads(t *testing.T) {
	t.Parallel()
	svc := testService("legacy-db", func(s *corev1.Service) {
		s.Spec.Selector = nil
		s.Spec.Ports = []corev1.ServicePort{{Name: "pg", Port: 5432}}
	})
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "legacy-db-abc12", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "legacy-db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("pg"), Port: ptr.To[int32](15432)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"192.168.5.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-1")},
			{Addresses: []string{"192.168.5.11"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			{Addresses: []string{"10.244.1.7"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "echo"}},
			{Addresses: []string{"192.168.5.12"}}, // nil ready means ready
		},
	}
	got := BuildEndpointSliceWorkloads(slice, svc, Config{})
	if len(got) != 3 {
		t.Fatalf("got %d workloads, want 3 (the pod endpoint is the pod's)", len(got))
	}
	for i, w := range got {
		checkGolden(t, "endpointslice/workload-"+string(rune('0'+i)), w)
	}
	if BuildEndpointSliceWorkloads(slice, nil, Config{}) != nil {
		t.Error("workloads for a slice without its Service")
	}
}

// TestEndpointSliceWorkloadFields checks what a pod-less endpoint's
// Workload carries, as istiod builds it: the slice's name, no workload
// name or type, canonical names, node or locality, HOST_NETWORK (its
// address may be shared), TCP ports only, and nothing for an endpoint
// with an unparsable or repeated address.
func TestEndpointSliceWorkloadFields(t *testing.T) {
	t.Parallel()
	svc := testService("legacy", func(s *corev1.Service) {
		s.Spec.Selector = nil
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Port: 80},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}
	})
	ports := []discoveryv1.EndpointPort{
		{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
		{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolUDP)},
	}
	workload := func(ip string, addr []byte) *workloadapi.Workload {
		return &workloadapi.Workload{
			Uid:         "Kubernetes/discovery.k8s.io/EndpointSlice/shop/legacy-manual/" + ip,
			Name:        "legacy-manual",
			Namespace:   "shop",
			Addresses:   [][]byte{addr},
			NetworkMode: workloadapi.NetworkMode_HOST_NETWORK,
			ClusterId:   "Kubernetes",
			Services: map[string]*workloadapi.PortList{"shop/legacy.shop.svc.cluster.local": {
				Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
			}},
		}
	}
	for _, tt := range []struct {
		name      string
		endpoints []discoveryv1.Endpoint
		want      []*workloadapi.Workload
	}{
		{
			name: "node and a non-pod targetRef are not used",
			endpoints: []discoveryv1.Endpoint{{
				Addresses: []string{"10.250.0.5"},
				NodeName:  ptr.To("node-1"),
				TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "node-1"},
			}},
			want: []*workloadapi.Workload{workload("10.250.0.5", []byte{10, 250, 0, 5})},
		},
		{
			name: "unparsable and repeated addresses",
			endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.250.0.6"}},
				{Addresses: []string{"10.250.0.6"}},
				{Addresses: []string{"10.250.0.7", "not-an-ip"}},
			},
			want: []*workloadapi.Workload{workload("10.250.0.6", []byte{10, 250, 0, 6})},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			slice := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "legacy-manual", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "legacy"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       ports,
				Endpoints:   tt.endpoints,
			}
			got := BuildEndpointSliceWorkloads(slice, svc, Config{})
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("BuildEndpointSliceWorkloads() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
