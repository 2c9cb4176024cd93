package xds_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
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
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestServiceEntryCannotTakeAServiceVIP: a ServiceEntry in another
// namespace that claims a Service's cluster IP changes nothing a node
// proxy sees: the Service keeps its VIP and endpoints, the ServiceEntry is
// served without the VIP and gets a Warning Event naming the owner, and
// deleting the ServiceEntry changes nothing either.
func TestServiceEntryCannotTakeAServiceVIP(t *testing.T) {
	m := startMesh(t, xds.Config{})
	p := m.connect(t, "ztunnel-vip", "node-1", proxyOptions{})
	ctx := t.Context()
	victim, attacker := env.Namespace(t, "victim", nil), env.Namespace(t, "attacker", nil)

	pod := ambientPod(t, victim, "echo", "node-1", "10.244.1.30", map[string]string{"app": "echo"})
	svc, err := env.Client.CoreV1().Services(victim).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := netip.MustParseAddr(svc.Spec.ClusterIP)
	key := workloadapi.ServiceKey(victim, "echo."+victim+".svc.cluster.local")
	eventually.Within(t, settle, "the Service and its pod reach the proxy", func() bool {
		ws := p.table.ServiceWorkloads(key)
		return len(p.table.Service(key).GetAddresses()) == 1 && len(ws) == 1 && ws[0].GetUid() == pod
	})
	before := proto.Clone(p.table.Service(key))

	// unchanged fails the test if the proxy's view of the Service moved.
	unchanged := func(step string) {
		t.Helper()
		if diff := cmp.Diff(before, p.table.Service(key), protocmp.Transform()); diff != "" {
			t.Errorf("%s: the Service changed (-before +now):\n%s", step, diff)
		}
		if ws := p.table.ServiceWorkloads(key); len(ws) != 1 || ws[0].GetUid() != pod {
			t.Errorf("%s: the Service's endpoints are %v, want only %s", step, ws, pod)
		}
		if _, got := p.table.ByAddress("", clusterIP); got.GetNamespace() != victim || got.GetName() != "echo" {
			t.Errorf("%s: the cluster IP %s leads to %v, want the Service", step, clusterIP, got)
		}
	}

	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "grab", Namespace: attacker}}
	se.Spec.Hosts = []string{"grab.example.com"}
	se.Spec.Addresses = []string{clusterIP.String()}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "tcp", Protocol: "TCP"}}
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.244.9.9"}}
	if _, err := istio.NetworkingV1().ServiceEntries(attacker).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seKey := workloadapi.ServiceKey(attacker, "grab.example.com")
	eventually.Within(t, settle, "the ServiceEntry reaches the proxy", func() bool { return p.table.Service(seKey) != nil })
	unchanged("ServiceEntry created")
	if got := p.table.Service(seKey).GetAddresses(); len(got) != 0 {
		t.Errorf("the ServiceEntry is served with addresses %v, want none", got)
	}

	// The controller reports the lost address as a Warning Event on the
	// ServiceEntry.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events("")})
	reporter := status.NewReporter(broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "canopy-controller"}))
	eventually.Within(t, settle, "a Warning Event on the ServiceEntry", func() bool {
		reporter.Report(m.index.Problems())
		evs, err := env.Client.CoreV1().Events(attacker).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "ServiceEntry" && ev.InvolvedObject.Name == "grab" && ev.Type == corev1.EventTypeWarning &&
				strings.Contains(ev.Message, "Service "+victim+"/echo") {
				return true
			}
		}
		return false
	})

	if err := istio.NetworkingV1().ServiceEntries(attacker).Delete(ctx, "grab", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the ServiceEntry leaves the proxy", func() bool { return p.table.Service(seKey) == nil })
	unchanged("ServiceEntry deleted")
}

// TestServiceEntryExportedToItsNamespace: a ServiceEntry with exportTo "."
// reaches every proxy (a node proxy serves pods of every namespace) marked
// NAMESPACE, and only its namespace's clients find it by its address.
func TestServiceEntryExportedToItsNamespace(t *testing.T) {
	m := startMesh(t, xds.Config{})
	p := m.connect(t, "ztunnel-export", "node-1", proxyOptions{})
	ns, other := env.Namespace(t, "team", nil), env.Namespace(t, "other", nil)
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "github", Namespace: ns}}
	se.Spec.Hosts = []string{"github.com"}
	se.Spec.Addresses = []string{"240.240.0.7"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}}
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.244.9.10"}}
	se.Spec.ExportTo = []string{"."}
	if _, err := istio.NetworkingV1().ServiceEntries(ns).Create(t.Context(), se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := workloadapi.ServiceKey(ns, "github.com")
	eventually.Within(t, settle, "the ServiceEntry reaches the proxy", func() bool { return p.table.Service(key) != nil })
	if v := p.table.Service(key).GetVisibility(); v != workloadapi.Service_NAMESPACE {
		t.Errorf("visibility = %v, want NAMESPACE", v)
	}
	ip := netip.MustParseAddr("240.240.0.7")
	if _, s := p.table.ByAddressFrom(ns, "", ip); s.GetName() != "github" {
		t.Errorf("a client of %s finds %v at %s, want the ServiceEntry", ns, s, ip)
	}
	if w, s := p.table.ByAddressFrom(other, "", ip); w != nil || s != nil {
		t.Errorf("a client of %s finds %v %v at %s, want nothing", other, w, s, ip)
	}
}
