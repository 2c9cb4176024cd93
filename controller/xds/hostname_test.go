package xds_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/canopy-mesh/canopy/controller/status"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/node/dns/authority"
	"github.com/canopy-mesh/canopy/node/route"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestServiceEntryCannotTakeAServiceName is issue 33's finding 2 as the
// attack, from the API server to a node proxy's answers: whoever may
// write ServiceEntries in namespace attacker declares host
// payments.<prod>.svc.cluster.local with an address and a backend of its
// own, before prod's Service exists. A node proxy's table, asked as the
// pods of four namespaces ask it (aaa and zzz sort before and after the
// others), answers every namespace but attacker with the Service's VIP
// and routes them to the Service's pod; the ServiceEntry is never
// canonical, and gets a Warning Event naming the Service. Before the fix,
// a pod of any namespace but prod got the attacker's address and backend.
func TestServiceEntryCannotTakeAServiceName(t *testing.T) {
	m := startMesh(t, xds.Config{})
	p := m.connect(t, "ztunnel-hostname", "node-1", proxyOptions{})
	ctx := t.Context()
	aaa, attacker := env.Namespace(t, "aaa", nil), env.Namespace(t, "attacker", nil)
	prod, zzz := env.Namespace(t, "prod", nil), env.Namespace(t, "zzz", nil)
	host := "payments." + prod + ".svc.cluster.local"
	serviceKey, entryKey := workloadapi.ServiceKey(prod, host), workloadapi.ServiceKey(attacker, host)

	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "grab", Namespace: attacker}}
	se.Spec.Hosts = []string{host}
	se.Spec.Addresses = []string{"240.240.6.6"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.244.6.6"}}
	if _, err := istio.NetworkingV1().ServiceEntries(attacker).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the ServiceEntry reaches the proxy", func() bool { return p.table.Service(entryKey) != nil })
	if p.table.Service(entryKey).GetCanonical() {
		t.Error("the ServiceEntry is canonical with no Service of its name")
	}

	pod := ambientPod(t, prod, "payments", "node-1", "10.244.1.40", map[string]string{"app": "payments"})
	svc, err := env.Client.CoreV1().Services(prod).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "payments"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "payments"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the Service and its pod reach the proxy", func() bool {
		ws := p.table.ServiceWorkloads(serviceKey)
		return p.table.Service(serviceKey).GetCanonical() && len(ws) == 1 && ws[0].GetUid() == pod
	})
	if p.table.Service(entryKey).GetCanonical() {
		t.Error("the ServiceEntry is canonical beside the Service")
	}

	// Each namespace's pod asks the name and connects to the answer.
	got := map[string]string{}
	for _, ns := range []string{aaa, attacker, prod, zzz} {
		client := &workloadapi.Workload{Uid: "client-" + ns, Namespace: ns, Name: "client"}
		ans, ok := authority.Lookup(p.table, "", authority.Client{Namespace: ns}, host, authority.IPv4)
		if !ok || len(ans.Addrs) != 1 {
			t.Errorf("%s: %s answered %v, %v; want one address", ns, host, ans.Addrs, ok)
			continue
		}
		r, err := route.Decide(p.table, client, netip.AddrPortFrom(ans.Addrs[0], 80), func(int) int { return 0 })
		if err != nil {
			t.Errorf("%s: route to %s: %v", ns, ans.Addrs[0], err)
			continue
		}
		backend := "outside the mesh"
		if r.Workload != nil {
			backend = r.Workload.GetUid()
		}
		got[ns] = ans.Service.GetNamespace() + " " + ans.Addrs[0].String() + " -> " + backend
	}
	toService := prod + " " + svc.Spec.ClusterIP + " -> " + pod
	toEntry := attacker + " 240.240.6.6 -> " + workloadapi.ServiceEntryUID("Kubernetes", attacker, "grab", "10.244.6.6")
	want := map[string]string{aaa: toService, attacker: toEntry, prod: toService, zzz: toService}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("who answers %s and where a connection goes, by the client's namespace (-want +got):\n%s", host, diff)
	}

	// The controller reports the ServiceEntry that lost as a Warning
	// Event on it, naming the Service.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events("")})
	reporter := status.NewReporter(broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "canopy-controller"}))
	eventually.Within(t, settle, "a Warning Event on the ServiceEntry naming the Service", func() bool {
		reporter.Report(m.index.Problems())
		evs, err := env.Client.CoreV1().Events(attacker).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "ServiceEntry" && ev.InvolvedObject.Name == "grab" && ev.Type == corev1.EventTypeWarning &&
				ev.Reason == status.ReasonNotApplied && strings.Contains(ev.Message, "Service "+prod+"/payments") {
				return true
			}
		}
		return false
	})
}
