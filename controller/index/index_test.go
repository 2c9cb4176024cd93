package index

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingapi "istio.io/api/networking/v1alpha3"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

func pod(name, node string, lbls map[string]string, ip string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: "default"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return p
}

func service(name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Spec: corev1.ServiceSpec{
			Selector: selector, ClusterIPs: []string{"10.96.0.50"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func node(name, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
}

const (
	podA = "Kubernetes//Pod/shop/a"
	podB = "Kubernetes//Pod/shop/b"
	svc  = "shop/echo.shop.svc.cluster.local"
)

// check compares the tables' changes; TestSidecarInputsChanged tests
// ChangeSet.SidecarInputs.
func check(t *testing.T, step string, got, want ChangeSet) {
	t.Helper()
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmpopts.SortSlices(func(a, b string) bool { return a < b }),
		cmpopts.IgnoreFields(ChangeSet{}, "SidecarInputs")); diff != "" {
		t.Errorf("%s: change set mismatch (-want +got):\n%s", step, diff)
	}
}

func addr(added, updated, removed []string) ChangeSet {
	return ChangeSet{Addresses: Changes{Added: added, Updated: updated, Removed: removed}}
}

func TestIndexChangeSets(t *testing.T) {
	x := New(ambient.Config{})
	echo := map[string]string{"app": "echo"}

	check(t, "pod without IP", x.UpsertPod(pod("a", "n1", echo, "")), ChangeSet{})
	check(t, "pod gets IP", x.UpsertPod(pod("a", "n1", echo, "10.244.1.5")), addr([]string{podA}, nil, nil))
	check(t, "second pod on another node", x.UpsertPod(pod("b", "n2", echo, "10.244.2.5")), addr([]string{podB}, nil, nil))
	check(t, "same pod again", x.UpsertPod(pod("b", "n2", echo, "10.244.2.5")), ChangeSet{})

	check(t, "service selecting both", x.UpsertService(service("echo", echo)), addr([]string{svc}, []string{podA, podB}, nil))
	if w := x.Address(podA).GetWorkload(); w.GetServices()[svc] == nil {
		t.Errorf("pod a's services = %v, want %s", w.GetServices(), svc)
	}
	check(t, "pod b relabelled away", x.UpsertPod(pod("b", "n2", map[string]string{"app": "other"}, "10.244.2.5")), addr(nil, []string{podB}, nil))
	check(t, "service selector narrowed to nothing", x.UpsertService(service("echo", map[string]string{"app": "none"})), addr(nil, []string{podA}, nil))
	check(t, "service back", x.UpsertService(service("echo", echo)), addr(nil, []string{podA}, nil))

	check(t, "node n1 labels reach only its pods", x.UpsertNode(node("n1", "zone-a")), addr(nil, []string{podA}, nil))
	if got := x.Address(podA).GetWorkload().GetLocality().GetZone(); got != "zone-a" {
		t.Errorf("pod a zone = %q", got)
	}
	check(t, "unrelated node", x.UpsertNode(node("n9", "zone-z")), ChangeSet{})
	heartbeat := node("n1", "zone-a")
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	check(t, "node status update recomputes nothing", x.UpsertNode(heartbeat), ChangeSet{})

	sel := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-echo", Namespace: "shop"}}
	sel.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: echo}
	sel.Spec.Rules = []*securityapi.Rule{{}}
	check(t, "selector policy", x.UpsertAuthorizationPolicy(sel), ChangeSet{
		Addresses:      Changes{Updated: []string{podA}},
		Authorizations: Changes{Added: []string{"shop/allow-echo"}},
	})
	if got := x.Address(podA).GetWorkload().GetAuthorizationPolicies(); !cmp.Equal(got, []string{"shop/allow-echo"}) {
		t.Errorf("pod a policies = %v", got)
	}
	nsPolicy := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "ns-wide", Namespace: "shop"}}
	check(t, "namespace policy touches no workload", x.UpsertAuthorizationPolicy(nsPolicy), ChangeSet{
		Authorizations: Changes{Added: []string{"shop/ns-wide"}},
	})
	check(t, "same policy again", x.UpsertAuthorizationPolicy(nsPolicy.DeepCopy()), ChangeSet{})
	audit := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "audit", Namespace: "shop"}}
	audit.Spec.Action = securityapi.AuthorizationPolicy_AUDIT
	check(t, "unsupported policy", x.UpsertAuthorizationPolicy(audit), ChangeSet{})
	if p := x.Problems()["AuthorizationPolicy shop/audit"]; p == "" {
		t.Errorf("no problem recorded for an AUDIT policy: %v", x.Problems())
	}
	check(t, "policy deleted", x.DeleteAuthorizationPolicy("shop", "allow-echo"), ChangeSet{
		Addresses:      Changes{Updated: []string{podA}},
		Authorizations: Changes{Removed: []string{"shop/allow-echo"}},
	})

	pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "istio-system"}}
	pa.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}
	const static = "istio-system/istio_converted_static_strict"
	check(t, "mesh strict: every workload lists the static policy", x.UpsertPeerAuthentication(pa), ChangeSet{
		Addresses:      Changes{Updated: []string{podA, podB}},
		Authorizations: Changes{Added: []string{static}},
	})
	if got := x.Address(podB).GetWorkload().GetAuthorizationPolicies(); !cmp.Equal(got, []string{static}) {
		t.Errorf("pod b policies under mesh STRICT = %v", got)
	}
	nsPermissive := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "relaxed", Namespace: "shop"}}
	nsPermissive.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_PERMISSIVE}
	check(t, "namespace permissive relaxes the mesh", x.UpsertPeerAuthentication(nsPermissive), addr(nil, []string{podA, podB}, nil))
	check(t, "namespace policy deleted", x.DeletePeerAuthentication("shop", "relaxed"), addr(nil, []string{podA, podB}, nil))
	relaxed := pa.DeepCopy()
	relaxed.Spec.Mtls.Mode = securityapi.PeerAuthentication_MutualTLS_PERMISSIVE
	check(t, "mesh permissive", x.UpsertPeerAuthentication(relaxed), addr(nil, []string{podA, podB}, nil))
	check(t, "last PeerAuthentication deleted", x.DeletePeerAuthentication("istio-system", "default"), ChangeSet{
		Authorizations: Changes{Removed: []string{static}},
	})

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{ambient.LabelUseWaypoint: "waypoint"}}}
	check(t, "namespace binds a missing waypoint", x.UpsertNamespace(ns), ChangeSet{})
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Namespace: "shop", Labels: map[string]string{ambient.LabelWaypointFor: "all"}},
		Spec:       gatewayv1.GatewaySpec{GatewayClassName: ambient.WaypointClass},
		Status:     gatewayv1.GatewayStatus{Addresses: []gatewayv1.GatewayStatusAddress{{Type: ptr.To(gatewayv1.IPAddressType), Value: "10.96.0.99"}}},
	}
	check(t, "waypoint appears", x.UpsertGateway(gw), addr(nil, []string{podA, podB, svc}, nil))
	programmed := gw.DeepCopy()
	programmed.Status.Conditions = []metav1.Condition{{Type: "Programmed", Status: metav1.ConditionTrue}}
	check(t, "waypoint condition update recomputes nothing", x.UpsertGateway(programmed), ChangeSet{})
	ingress := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "ingress", Namespace: "shop"}, Spec: gatewayv1.GatewaySpec{GatewayClassName: "istio"}}
	check(t, "ingress gateway", x.UpsertGateway(ingress), ChangeSet{})
	if x.Address(svc).GetService().GetWaypoint() == nil || x.Address(podA).GetWorkload().GetWaypoint() == nil {
		t.Error("waypoint not bound")
	}

	check(t, "pod deleted", x.DeletePod("shop", "a"), addr(nil, nil, []string{podA}))
	check(t, "service deleted", x.DeleteService("shop", "echo"), addr(nil, nil, []string{svc}))
	if got := x.AddressNames(); !cmp.Equal(got, []string{podB}) {
		t.Errorf("addresses left = %v", got)
	}
}

func TestIndexPublishedProtosAreNotModified(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertPod(pod("a", "n1", map[string]string{"app": "echo"}, "10.244.1.5"))
	before := x.Address(podA)
	snapshot := fmt.Sprint(before)
	x.UpsertService(service("echo", map[string]string{"app": "echo"}))
	if fmt.Sprint(before) != snapshot {
		t.Error("an update modified a published Address")
	}
	if x.Address(podA) == before {
		t.Error("the recomputed Address is the same object")
	}
}

func TestIndexEndpointSlices(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertPod(pod("a", "n1", nil, "10.244.1.5"))
	legacy := service("legacy", nil) // no selector: members come from its slices
	check(t, "selector-less service", x.UpsertService(legacy), addr([]string{"shop/legacy.shop.svc.cluster.local"}, nil, nil))

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "legacy"}},
		Ports:      []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "a"}},
			{Addresses: []string{"192.168.7.7"}},
		},
	}
	ext := "Kubernetes/discovery.k8s.io/EndpointSlice/shop/legacy-1/192.168.7.7"
	check(t, "slice adds the pod to the service and a pod-less workload", x.UpsertEndpointSlice(slice), addr([]string{ext}, []string{podA}, nil))
	if x.Address(podA).GetWorkload().GetServices()["shop/legacy.shop.svc.cluster.local"] == nil {
		t.Errorf("pod a not in the selector-less service: %v", x.Address(podA).GetWorkload().GetServices())
	}
	shrunk := slice.DeepCopy()
	shrunk.Endpoints = shrunk.Endpoints[:1]
	check(t, "endpoint removed", x.UpsertEndpointSlice(shrunk), addr(nil, nil, []string{ext}))
	check(t, "slice deleted", x.DeleteEndpointSlice("shop", "legacy-1"), addr(nil, []string{podA}, nil))
}

func TestIndexServiceAndWorkloadEntries(t *testing.T) {
	x := New(ambient.Config{})
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "shop"}}
	we.Spec.Address = "10.10.1.1"
	we.Spec.Labels = map[string]string{"app": "payments"}
	vm := "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"
	check(t, "workload entry", x.UpsertWorkloadEntry(we), addr([]string{vm}, nil, nil))

	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: "shop"}}
	se.Spec.Hosts = []string{"payments.example.com"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https"}}
	se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "payments"}}
	se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.2.2"}}
	host := "shop/payments.example.com"
	inline := "Kubernetes/networking.istio.io/ServiceEntry/shop/payments/10.10.2.2"
	check(t, "service entry selects the VM", x.UpsertServiceEntry(se), addr([]string{host, inline}, []string{vm}, nil))
	if x.Address(vm).GetWorkload().GetServices()[host] == nil {
		t.Error("VM not in the ServiceEntry's host")
	}
	moved := se.DeepCopy()
	moved.Spec.Hosts = []string{"pay.example.com"}
	moved.Spec.Endpoints = nil
	check(t, "host renamed and endpoint dropped", x.UpsertServiceEntry(moved),
		addr([]string{"shop/pay.example.com"}, []string{vm}, []string{host, inline}))
	check(t, "service entry deleted", x.DeleteServiceEntry("shop", "payments"), addr(nil, []string{vm}, []string{"shop/pay.example.com"}))
	check(t, "workload entry deleted", x.DeleteWorkloadEntry("shop", "vm-1"), addr(nil, nil, []string{vm}))

	p := pod("pay-1", "n1", map[string]string{"app": "payments"}, "10.244.1.20")
	p.Spec.Containers = []corev1.Container{{Name: "pay", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}}}}
	podPay := "Kubernetes//Pod/shop/pay-1"
	check(t, "pod", x.UpsertPod(p), addr([]string{podPay}, nil, nil))
	check(t, "service entry selects the pod", x.UpsertServiceEntry(se), addr([]string{host, inline}, []string{podPay}, nil))
	if pl := x.Address(podPay).GetWorkload().GetServices()[host]; len(pl.GetPorts()) != 1 || pl.GetPorts()[0].GetTargetPort() != 8443 {
		t.Errorf("pod's ServiceEntry ports = %v, want 443 -> 8443 by port name", pl)
	}
}

func TestIndexReportsUnresolvedNamedPorts(t *testing.T) {
	x := New(ambient.Config{})
	s := service("web", map[string]string{"app": "web"})
	s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}
	x.UpsertService(s)
	if p := x.Problems()["Service shop/web"]; p != "" {
		t.Errorf("a Service without pods has a problem: %q", p)
	}
	x.UpsertPod(pod("w", "n1", map[string]string{"app": "web"}, "10.244.1.9"))
	if p := x.Problems()["Service shop/web"]; p == "" {
		t.Error("no problem for a named target port no pod declares")
	}
	withPort := pod("w", "n1", map[string]string{"app": "web"}, "10.244.1.9")
	withPort.Spec.Containers = []corev1.Container{{Name: "web", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}
	x.UpsertPod(withPort)
	if p := x.Problems()["Service shop/web"]; p != "" {
		t.Errorf("problem remains after the pod declared the port: %q", p)
	}
}

func TestIndexKeepsConfiguredNetwork(t *testing.T) {
	x := New(ambient.Config{Network: "net-1"})
	x.UpsertPod(pod("a", "n1", nil, "10.244.1.5"))
	check(t, "unrelated namespace", x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}), ChangeSet{})
	check(t, "system namespace without label", x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}), ChangeSet{})
	if got := x.Address(podA).GetWorkload().GetNetwork(); got != "net-1" {
		t.Errorf("network = %q, want the configured net-1", got)
	}
}

func TestIndexNetworkFromSystemNamespace(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertPod(pod("a", "n1", nil, "10.244.1.5"))
	sys := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system", Labels: map[string]string{ambient.LabelNetwork: "net-east"}}}
	check(t, "network label", x.UpsertNamespace(sys), addr(nil, []string{podA}, nil))
	if got := x.Address(podA).GetWorkload().GetNetwork(); got != "net-east" {
		t.Errorf("network = %q, want net-east", got)
	}
	check(t, "label removed", x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}), addr(nil, []string{podA}, nil))
	if got := x.Address(podA).GetWorkload().GetNetwork(); got != "" {
		t.Errorf("network = %q after the label went, want the configured default", got)
	}
}

func TestIndexServiceNameOwners(t *testing.T) {
	x := New(ambient.Config{})
	newSE := func(name string, created int64) *networkingv1.ServiceEntry {
		se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", CreationTimestamp: metav1.Unix(created, 0)}}
		se.Spec.Hosts = []string{"echo.shop.svc.cluster.local"}
		se.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "http"}}
		return se
	}
	check(t, "service entry claims the service's name", x.UpsertServiceEntry(newSE("newer", 200)), addr([]string{svc}, nil, nil))
	check(t, "an older entry wins", x.UpsertServiceEntry(newSE("older", 100)), addr(nil, []string{svc}, nil))
	if got := x.Address(svc).GetService().GetName(); got != "older" {
		t.Errorf("published %q, want the older entry", got)
	}
	check(t, "the kubernetes service wins", x.UpsertService(service("echo", nil)), addr(nil, []string{svc}, nil))
	check(t, "the older entry goes, the service stays", x.DeleteServiceEntry("shop", "older"), ChangeSet{})
	check(t, "the service goes, the remaining entry returns", x.DeleteService("shop", "echo"), addr(nil, []string{svc}, nil))
	if got := x.Address(svc).GetService().GetName(); got != "newer" {
		t.Errorf("published %q, want the remaining entry", got)
	}
	check(t, "last owner gone", x.DeleteServiceEntry("shop", "newer"), addr(nil, nil, []string{svc}))
}

// TestPodReads: the CA reads pods by name and by node through the index;
// a pod that moves or goes is followed.
func TestPodReads(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertPod(pod("a", "n1", nil, ""))
	x.UpsertPod(pod("b", "n1", nil, ""))
	x.UpsertPod(pod("c", "n2", nil, ""))
	other := pod("d", "n1", nil, "")
	other.Namespace = "elsewhere"
	x.UpsertPod(other)
	names := func(ps []*corev1.Pod) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tt := range []struct {
		name   string
		change func()
		node   string
		want   []string
	}{
		{"by node and namespace", func() {}, "n1", []string{"shop/a", "shop/b"}},
		{"a pod moves", func() { x.UpsertPod(pod("b", "n2", nil, "")) }, "n1", []string{"shop/a"}},
		{"a pod goes", func() { x.DeletePod("shop", "a") }, "n1", nil},
		{"the other node", func() {}, "n2", []string{"shop/b", "shop/c"}},
	} {
		tt.change()
		if diff := cmp.Diff(tt.want, names(x.PodsOnNode("shop", tt.node))); diff != "" {
			t.Errorf("%s: PodsOnNode(shop, %s) (-want +got):\n%s", tt.name, tt.node, diff)
		}
	}
	if p := x.Pod("shop", "c"); p == nil || p.Spec.NodeName != "n2" {
		t.Errorf("Pod(shop/c) = %v", p)
	}
	if p := x.Pod("shop", "a"); p != nil {
		t.Errorf("deleted pod still returned: %v", p.Name)
	}
}

// TestIndexNamespaceTrafficDistribution: the namespace's
// networking.istio.io/traffic-distribution annotation reaches its Services
// and ServiceEntries, and only a change of it recomputes them.
func TestIndexNamespaceTrafficDistribution(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	x.UpsertService(service("echo", nil))
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "shop"}}
	se.Spec.Hosts = []string{"api.example.com"}
	se.Spec.Addresses = []string{"240.0.0.1"}
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	x.UpsertServiceEntry(se)
	annotated := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Annotations: map[string]string{ambient.AnnotationTrafficDistribution: "PreferSameZone"}}}
	check(t, "annotation added", x.UpsertNamespace(annotated), addr(nil, []string{svc, "shop/api.example.com"}, nil))
	for _, name := range []string{svc, "shop/api.example.com"} {
		if got := x.Address(name).GetService().GetLoadBalancing().GetMode(); got != workloadapi.LoadBalancing_FAILOVER {
			t.Errorf("%s load_balancing mode = %v, want FAILOVER", name, got)
		}
	}
	other := annotated.DeepCopy()
	other.Annotations["unrelated"] = "x"
	check(t, "unrelated annotation", x.UpsertNamespace(other), ChangeSet{})
}

// TestIndexSliceTargetRefUID: an EndpointSlice targetRef joins a pod to a
// selector-less Service when it carries the pod's uid or none; one with
// another uid names an earlier pod of that name.
func TestIndexSliceTargetRefUID(t *testing.T) {
	const legacy = "shop/legacy.shop.svc.cluster.local"
	for _, tt := range []struct {
		name   string
		refUID types.UID
		want   bool
	}{
		{name: "the pod's uid", refUID: "uid-a", want: true},
		{name: "no uid", refUID: "", want: true},
		{name: "an earlier pod's uid", refUID: "uid-old", want: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := New(ambient.Config{})
			p := pod("a", "n1", nil, "10.244.1.5")
			p.UID = "uid-a"
			x.UpsertPod(p)
			x.UpsertService(service("legacy", nil))
			x.UpsertEndpointSlice(&discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "legacy-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "legacy"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{
					{Addresses: []string{"10.244.1.5"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "a", UID: tt.refUID}},
				},
			})
			if got := x.Address(podA).GetWorkload().GetServices()[legacy] != nil; got != tt.want {
				t.Errorf("pod a is a member of %s: %v, want %v", legacy, got, tt.want)
			}
		})
	}
}

func TestIndexNamespaceLabels(t *testing.T) {
	x := New(ambient.Config{})
	if _, ok := x.NamespaceLabels("shop"); ok {
		t.Error("NamespaceLabels of an unknown namespace: ok")
	}
	x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"istio-injection": "enabled"}}})
	got, ok := x.NamespaceLabels("shop")
	if !ok || got["istio-injection"] != "enabled" {
		t.Errorf("NamespaceLabels(shop) = %v, %v", got, ok)
	}
	got["istio-injection"] = "disabled" // a copy: the index keeps its own
	if again, _ := x.NamespaceLabels("shop"); again["istio-injection"] != "enabled" {
		t.Errorf("NamespaceLabels returned the index's own map")
	}
	x.DeleteNamespace("shop")
	if _, ok := x.NamespaceLabels("shop"); ok {
		t.Error("NamespaceLabels of a deleted namespace: ok")
	}
}
