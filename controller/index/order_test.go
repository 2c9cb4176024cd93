package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// event is one informer event applied to an index.
type event struct {
	name  string
	apply func(*Index)
}

// orderFixture is a small mesh whose outputs could depend on the order
// its objects arrive in: pods of two namespaces selected by Services,
// ServiceEntries and policies, a selector-less Service with its
// EndpointSlice, ServiceEntries contending for a VIP and a hostname,
// WorkloadEntries, and PeerAuthentications at every scope.
func orderFixture() []event {
	var evs []event
	add := func(name string, f func(*Index)) { evs = append(evs, event{name, f}) }
	for _, ns := range []string{"shop", "web", "istio-system"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}}
		add("namespace "+ns, func(x *Index) { x.UpsertNamespace(n) })
	}
	for i, zone := range []string{"zone-a", "zone-b"} {
		n := node(fmt.Sprintf("n%d", i), zone)
		add("node "+n.Name, func(x *Index) { x.UpsertNode(n) })
	}
	for i := range 12 {
		ns := []string{"shop", "web"}[i%2]
		app := []string{"a", "b", "c"}[i%3]
		p := pod(fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i%2), map[string]string{"app": app, "tier": "backend"}, fmt.Sprintf("10.244.%d.%d", i%2, 10+i))
		p.Namespace = ns
		p.Annotations = map[string]string{ambient.AnnotationRedirection: "enabled"}
		p.Spec.Containers = []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8080 + i%2)}}}}
		add("pod "+ns+"/"+p.Name, func(x *Index) { x.UpsertPod(p) })
	}
	for i, ns := range []string{"shop", "web"} {
		for j, app := range []string{"a", "b"} {
			s := service(app, map[string]string{"app": app})
			s.Namespace = ns
			s.Spec.ClusterIPs = []string{fmt.Sprintf("10.96.%d.%d", i, j+1)}
			s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}, {Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090)}}
			add("service "+ns+"/"+app, func(x *Index) { x.UpsertService(s) })
		}
	}
	legacy := service("legacy", nil)
	legacy.Spec.ClusterIPs = []string{"10.96.0.9"}
	add("service shop/legacy", func(x *Index) { x.UpsertService(legacy) })
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "legacy"}},
		Ports:      []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.10"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p0"}},
			{Addresses: []string{"192.168.7.7"}},
		},
	}
	add("endpointslice shop/legacy-1", func(x *Index) { x.UpsertEndpointSlice(slice) })
	// Three ServiceEntries claim one VIP and one hostname; rank decides,
	// whatever order they come in.
	for i, ns := range []string{"shop", "web", "shop"} {
		se := entryAt(ns, fmt.Sprintf("ext-%d", i), "240.240.0.1", int64(100-i))
		se.Spec.Hosts = []string{"shared.example.com"}
		se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
		se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "c"}}
		add("serviceentry "+ns+"/"+se.Name, func(x *Index) { x.UpsertServiceEntry(se) })
	}
	inline := entryAt("web", "inline", "240.240.0.2", 50)
	inline.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	inline.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.10.2.2"}, {Address: "10.10.2.3", Labels: map[string]string{"app": "a"}}}
	add("serviceentry web/inline", func(x *Index) { x.UpsertServiceEntry(inline) })
	for i := range 2 {
		we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%d", i), Namespace: "shop", Labels: map[string]string{"app": "a"}}}
		we.Spec.Address = fmt.Sprintf("10.10.1.%d", i+1)
		we.Spec.Ports = map[string]uint32{"http": 8080}
		add("workloadentry shop/"+we.Name, func(x *Index) { x.UpsertWorkloadEntry(we) })
	}
	for _, p := range []*securityv1.AuthorizationPolicy{
		selectorPolicy("shop", "allow-a", map[string]string{"app": "a"}),
		selectorPolicy("shop", "allow-backend", map[string]string{"tier": "backend"}),
		selectorPolicy("web", "z-allow-b", map[string]string{"app": "b"}),
		selectorPolicy("istio-system", "mesh-allow-c", map[string]string{"app": "c"}),
		{ObjectMeta: metav1.ObjectMeta{Name: "deny-all-web", Namespace: "web"}},
	} {
		add("authorizationpolicy "+p.Namespace+"/"+p.Name, func(x *Index) { x.UpsertAuthorizationPolicy(p) })
	}
	mesh := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "istio-system"}}
	mesh.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}
	relaxed := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "relaxed", Namespace: "web"}}
	relaxed.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_PERMISSIVE}
	ports := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "ports", Namespace: "web"}}
	ports.Spec.Selector = selectorPolicy("web", "", map[string]string{"app": "b"}).Spec.Selector
	ports.Spec.PortLevelMtls = map[uint32]*securityapi.PeerAuthentication_MutualTLS{
		8080: {Mode: securityapi.PeerAuthentication_MutualTLS_DISABLE},
		9090: {Mode: securityapi.PeerAuthentication_MutualTLS_STRICT},
	}
	for _, pa := range []*securityv1.PeerAuthentication{mesh, relaxed, ports} {
		add("peerauthentication "+pa.Namespace+"/"+pa.Name, func(x *Index) { x.UpsertPeerAuthentication(pa) })
	}
	return evs
}

// outputs are every published resource, by name.
type outputs struct {
	Addresses, Authorizations map[string]proto.Message
}

func outputsOf(x *Index) outputs {
	out := outputs{Addresses: map[string]proto.Message{}, Authorizations: map[string]proto.Message{}}
	for _, n := range x.AddressNames() {
		out.Addresses[n] = x.Address(n)
	}
	for _, n := range x.AuthorizationNames() {
		out.Authorizations[n] = x.Authorization(n)
	}
	return out
}

// TestOutputsDoNotDependOnEventOrder: the tables are a function of the
// objects, not of the order their events came in, nor of what came and
// went before. A restarted controller lists the cluster in one order, a
// running one has seen its history, and two replicas interleave their
// informers differently; all must publish the same content, so that a
// resource's version (a hash of it) is the same everywhere and a node
// proxy that reconnects to any of them is sent nothing it holds.
func TestOutputsDoNotDependOnEventOrder(t *testing.T) {
	t.Parallel()
	evs := orderFixture()
	build := func(order []event) outputs {
		x := New(ambient.Config{})
		for _, e := range order {
			e.apply(x)
		}
		return outputsOf(x)
	}
	want := build(evs)
	if len(want.Addresses) < 20 || len(want.Authorizations) < 5 {
		t.Fatalf("fixture too small: %d addresses, %d authorizations", len(want.Addresses), len(want.Authorizations))
	}
	orders := map[string][]event{"reversed": slices.Clone(evs)}
	slices.Reverse(orders["reversed"])
	for seed := range uint64(8) {
		order := slices.Clone(evs)
		rand.New(rand.NewPCG(seed, seed)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		orders[fmt.Sprintf("shuffled %d", seed)] = order
	}
	// A history: everything, then every object deleted and added back in
	// another order, as a long-running controller sees the same cluster.
	history := slices.Clone(evs)
	history = append(history, event{"namespace web deleted", func(x *Index) { x.DeleteNamespace("web") }},
		event{"serviceentry shop/ext-2 deleted", func(x *Index) { x.DeleteServiceEntry("shop", "ext-2") }},
		event{"service shop/a deleted", func(x *Index) { x.DeleteService("shop", "a") }},
		event{"pod shop/p0 deleted", func(x *Index) { x.DeletePod("shop", "p0") }},
		event{"peerauthentication istio-system/default deleted", func(x *Index) { x.DeletePeerAuthentication("istio-system", "default") }},
		event{"authorizationpolicy shop/allow-a deleted", func(x *Index) { x.DeleteAuthorizationPolicy("shop", "allow-a") }})
	again := slices.Clone(evs)
	rand.New(rand.NewPCG(99, 99)).Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
	orders["history"] = append(history, again...)

	for name, order := range orders {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(want, build(order), protocmp.Transform()); diff != "" {
				t.Errorf("tables differ from the ones built in fixture order (-want +got):\n%s", diff)
			}
		})
	}
}
