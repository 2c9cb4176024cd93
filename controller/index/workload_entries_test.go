package index

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestIndexServiceSelectsWorkloadEntry: a Kubernetes Service whose selector
// matches a WorkloadEntry of its namespace has it as an endpoint, as istiod
// does by default (PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES=true;
// workloadEntryWorkloadBuilder in pilot/pkg/serviceregistry/ambient/workloads.go),
// with target ports from the entry's ports (constructServicesFromWorkloadEntry).
func TestIndexServiceSelectsWorkloadEntry(t *testing.T) {
	x := New(ambient.Config{})
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "shop"}}
	we.Spec.Address = "10.10.1.1"
	we.Spec.Labels = map[string]string{"app": "payments"}
	we.Spec.Ports = map[string]uint32{"https": 9443}
	vm := "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"
	x.UpsertWorkloadEntry(we)

	s := service("payments", map[string]string{"app": "payments"})
	s.Spec.Ports = []corev1.ServicePort{
		{Name: "https", Port: 443, TargetPort: intstr.FromString("https")},
		{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
	}
	name := "shop/payments.shop.svc.cluster.local"
	check(t, "service selecting the entry", x.UpsertService(s), addr([]string{name}, []string{vm}, nil))
	want := &workloadapi.PortList{Ports: []*workloadapi.Port{{ServicePort: 443, TargetPort: 9443}, {ServicePort: 80, TargetPort: 8080}}}
	if diff := cmp.Diff(want, x.Address(vm).GetWorkload().GetServices()[name], protocmp.Transform()); diff != "" {
		t.Errorf("entry's ports for the Service (-want +got):\n%s", diff)
	}

	other := service("other", map[string]string{"app": "payments"})
	other.Namespace = "elsewhere"
	other.Spec.ClusterIPs = []string{"10.96.0.51"}
	check(t, "service of another namespace", x.UpsertService(other), addr([]string{"elsewhere/other.elsewhere.svc.cluster.local"}, nil, nil))

	check(t, "selector moved away", x.UpsertService(service("payments", map[string]string{"app": "web"})), addr(nil, []string{name, vm}, nil))
	if got := x.Address(vm).GetWorkload().GetServices(); got[name] != nil {
		t.Errorf("entry still in the Service: %v", got)
	}
	check(t, "selector back", x.UpsertService(s), addr(nil, []string{name, vm}, nil))
	relabelled := we.DeepCopy()
	relabelled.Spec.Labels = map[string]string{"app": "web"}
	check(t, "entry relabelled", x.UpsertWorkloadEntry(relabelled), addr(nil, []string{vm}, nil))
	check(t, "entry back", x.UpsertWorkloadEntry(we), addr(nil, []string{vm}, nil))
	check(t, "service deleted", x.DeleteService("shop", "payments"), addr(nil, []string{vm}, []string{name}))
}
