package xds_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/securitypolicy"
)

// The proxies' addresses in TestEventsMatchARebuild: the sidecar's is a
// pod of the world (its inbound side has endpoints), the proxyless
// client's is not.
const (
	clientIP     = "10.9.0.1"
	grpcClientIP = "10.9.0.2"
)

// world is the Kubernetes objects TestEventsMatchARebuild's events
// produce, by "<Kind> <namespace>/<name>". A small, fixed set of names
// and values makes events collide: a pod joins and leaves a Service, a
// policy selects it and stops, a namespace gains a waypoint and loses it.
type world struct {
	system  string // the proxies' namespace (also the xDS server's system namespace)
	objects map[string]any
	last    string
	created time.Time
}

func newWorld(system string) *world {
	return &world{system: system, objects: map[string]any{}, created: time.Unix(1_700_000_000, 0)}
}

var (
	worldNamespaces = []string{"ra", "rb"}
	worldNodes      = []string{"node-1", "node-2"}
)

type worldPod struct{ ns, name, app, ip string }

func (w *world) pods() []worldPod {
	return []worldPod{
		{"ra", "a-1", "a", "10.1.0.1"}, {"ra", "a-2", "a", "10.1.0.2"}, {"ra", "b-1", "b", "10.1.0.3"},
		{"rb", "a-1", "a", "10.2.0.1"}, {"rb", "b-1", "b", "10.2.0.2"},
		{w.system, "client", "client", clientIP},
	}
}

// services are the Services by namespace and name, with their VIPs.
func (w *world) services() [][3]string {
	return [][3]string{
		{"ra", "a", "10.96.0.10"}, {"ra", "b", "10.96.0.11"}, {"rb", "a", "10.96.1.10"}, {"rb", "b", "10.96.1.11"},
		{w.system, "client", "10.96.2.10"},
		{"ra", "ext", "10.96.0.20"}, // selector-less: its EndpointSlice names its endpoints
	}
}

// grpcListeners are the proxyless client's listener names: every
// Service port and the ServiceEntry's host.
func (w *world) grpcListeners() []string {
	var out []string
	for _, s := range w.services() {
		out = append(out, fmt.Sprintf("%s.%s.svc.cluster.local:80", s[1], s[0]))
	}
	return append(out, "ext.example.com:443")
}

func oneOf[T any](r *rand.Rand, vs ...T) T { return vs[r.IntN(len(vs))] }

func (w *world) meta(ns, name string) metav1.ObjectMeta {
	w.created = w.created.Add(time.Second)
	return metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(w.created)}
}

// change makes one random event and says what it did; w.last is the key
// it changed (its object now, or nil when deleted).
func (w *world) change(r *rand.Rand) string {
	events := []func(*rand.Rand) (string, any){
		w.pod, w.pod, w.pod, w.pod, w.service, w.namespace, w.namespace, w.namespace, w.node, w.slice, w.gateway,
		w.authorizationPolicy, w.authorizationPolicy, w.peerAuthentication,
		w.destinationRule, w.virtualService, w.sidecarResource, w.serviceEntry, w.workloadEntry,
	}
	k, obj := oneOf(r, events...)(r)
	gone := obj == nil || r.IntN(8) == 0
	if gone {
		delete(w.objects, k)
	} else {
		w.objects[k] = obj
	}
	w.last = k
	if gone {
		return "delete " + k
	}
	return "set " + k + ": " + describe(obj)
}

func describe(obj any) string {
	s := fmt.Sprintf("%+v", obj)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return strings.ReplaceAll(s, "\n", " ")
}

// pod creates a pod, or changes one thing of it as its controller or
// the kubelet does: whether sidecars are told hinges on that one thing.
func (w *world) pod(r *rand.Rand) (string, any) {
	p := oneOf(r, w.pods()...)
	k := "Pod " + p.ns + "/" + p.name
	old, ok := w.objects[k].(*corev1.Pod)
	if !ok {
		pod := &corev1.Pod{
			ObjectMeta: w.meta(p.ns, p.name),
			Spec: corev1.PodSpec{NodeName: oneOf(r, worldNodes...), ServiceAccountName: "default",
				Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		pod.Labels = map[string]string{"app": p.app, ambient.LabelVersion: "v1"}
		pod.Annotations = map[string]string{ambient.AnnotationRedirection: "enabled"}
		return k, pod
	}
	pod := old.DeepCopy()
	toggle := func(m map[string]string, key string, values ...string) {
		if _, set := m[key]; set && r.IntN(2) == 0 {
			delete(m, key)
			return
		}
		m[key] = oneOf(r, values...)
	}
	switch r.IntN(10) {
	case 0:
		toggle(pod.Labels, ambient.LabelVersion, "v1", "v2")
	case 1, 9:
		// Only a DestinationRule's subset reads it (the "front" subset):
		// nothing of the workload table changes.
		if pod.Labels["tier"] == "" {
			pod.Labels["tier"] = "front"
		} else {
			delete(pod.Labels, "tier")
		}
	case 2:
		toggle(pod.Labels, ambient.LabelUseWaypoint, "wp", ambient.NoWaypoint)
	case 3:
		pod.Spec.NodeName = oneOf(r, worldNodes...)
	case 4:
		pod.Spec.ServiceAccountName = oneOf(r, "default", "sa-"+p.app)
	case 5:
		pod.Status.Conditions[0].Status = oneOf(r, corev1.ConditionTrue, corev1.ConditionFalse)
	case 6:
		if pod.DeletionTimestamp == nil {
			pod.DeletionTimestamp = &metav1.Time{Time: w.created}
		} else {
			pod.DeletionTimestamp = nil
		}
	case 7:
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		toggle(pod.Annotations, ambient.AnnotationRedirection, "enabled")
	default:
		pod.Spec.Containers[0].Ports[0].Name = oneOf(r, "http", "web")
	}
	return k, pod
}

func (w *world) service(r *rand.Rand) (string, any) {
	s := oneOf(r, w.services()...)
	svc := &corev1.Service{ObjectMeta: w.meta(s[0], s[1]), Spec: corev1.ServiceSpec{ClusterIP: s[2], ClusterIPs: []string{s[2]}}}
	if s[1] != "ext" {
		svc.Spec.Selector = map[string]string{"app": s[1]}
	}
	if r.IntN(6) == 0 {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = corev1.ClusterIPNone, nil
	}
	port := corev1.ServicePort{Name: oneOf(r, "http", "tcp", "grpc-api", ""), Port: 80, Protocol: corev1.ProtocolTCP,
		TargetPort: oneOf(r, intstr.FromInt32(8080), intstr.FromString("http"))}
	if r.IntN(3) == 0 {
		port.AppProtocol = new(oneOf(r, "http", "kubernetes.io/h2c", "tcp"))
	}
	svc.Spec.Ports = []corev1.ServicePort{port}
	if r.IntN(4) == 0 {
		svc.Labels = map[string]string{ambient.LabelUseWaypoint: oneOf(r, "wp", ambient.NoWaypoint)}
	}
	if r.IntN(4) == 0 {
		svc.Annotations = map[string]string{ambient.AnnotationTrafficDistribution: oneOf(r, "PreferClose", "PreferSameNode")}
	}
	return "Service " + s[0] + "/" + s[1], svc
}

// namespace changes one label or annotation of a namespace, as an edit
// does: whether a recompute follows hinges on that one key.
func (w *world) namespace(r *rand.Rand) (string, any) {
	name := oneOf(r, "ra", "ra", "rb", w.system)
	k := "Namespace /" + name
	ns := &corev1.Namespace{ObjectMeta: w.meta("", name)}
	if old, ok := w.objects[k].(*corev1.Namespace); ok {
		ns.Labels, ns.Annotations = maps.Clone(old.Labels), maps.Clone(old.Annotations)
	}
	toggle := func(m *map[string]string, key string, values ...string) {
		if *m == nil {
			*m = map[string]string{}
		}
		if _, set := (*m)[key]; set && r.IntN(2) == 0 {
			delete(*m, key)
			return
		}
		(*m)[key] = oneOf(r, values...)
	}
	switch r.IntN(6) {
	case 0:
		toggle(&ns.Labels, "team", "x", "y") // read by nothing
	case 1:
		toggle(&ns.Labels, "istio.io/dataplane-mode", "ambient")
	case 2:
		toggle(&ns.Labels, ambient.LabelUseWaypoint, "wp", ambient.NoWaypoint)
	case 3:
		toggle(&ns.Labels, ambient.LabelUseWaypointNamespace, "ra", "rb")
	case 4:
		toggle(&ns.Labels, ambient.LabelIngressUseWaypoint, "true", "false")
	default:
		toggle(&ns.Annotations, ambient.AnnotationTrafficDistribution, "PreferClose", "PreferSameNode")
	}
	return k, ns
}

// node changes one label of a node.
func (w *world) node(r *rand.Rand) (string, any) {
	name := oneOf(r, worldNodes...)
	k := "Node /" + name
	n := &corev1.Node{ObjectMeta: w.meta("", name)}
	n.Labels = map[string]string{"kubernetes.io/hostname": name}
	if old, ok := w.objects[k].(*corev1.Node); ok {
		n.Labels = maps.Clone(old.Labels)
	}
	key := oneOf(r, corev1.LabelTopologyRegion, corev1.LabelTopologyZone, ambient.LabelSubzone, "heartbeat")
	if _, set := n.Labels[key]; set && r.IntN(3) == 0 {
		delete(n.Labels, key)
	} else {
		n.Labels[key] = oneOf(r, "1", "2")
	}
	return k, n
}

// slice is the selector-less Service's EndpointSlice: a pod of its
// namespace, an address outside the world, or both.
func (w *world) slice(r *rand.Rand) (string, any) {
	s := &discoveryv1.EndpointSlice{ObjectMeta: w.meta("ra", "ext-1"), AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: new(""), Port: new(int32(oneOf(r, 8080, 9090)))}}}
	s.Labels = map[string]string{discoveryv1.LabelServiceName: "ext"}
	ready := oneOf(r, true, false)
	for _, ip := range oneOf(r, []string{"10.1.0.1"}, []string{"10.3.0.1"}, []string{"10.1.0.3", "10.3.0.1"}) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return "EndpointSlice ra/ext-1", s
}

// gateway is the waypoint "wp" of namespace ra.
func (w *world) gateway(r *rand.Rand) (string, any) {
	gw := &gatewayv1.Gateway{ObjectMeta: w.meta("ra", "wp"), Spec: gatewayv1.GatewaySpec{
		GatewayClassName: ambient.WaypointClass,
		Listeners:        []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}},
	}}
	if r.IntN(6) > 0 {
		gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: new(gatewayv1.IPAddressType), Value: oneOf(r, "10.96.0.99", "10.96.0.98")}}
	}
	if r.IntN(3) == 0 {
		gw.Labels = map[string]string{ambient.LabelWaypointFor: oneOf(r, "service", "workload", "all", "none")}
	}
	return "Gateway ra/wp", gw
}

func (w *world) authorizationPolicy(r *rand.Rand) (string, any) {
	ns := oneOf(r, "ra", "istio-system")
	name := oneOf(r, "p1", "p2")
	p := &securityv1.AuthorizationPolicy{ObjectMeta: w.meta(ns, name)}
	switch r.IntN(3) {
	case 0:
		p.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": oneOf(r, "a", "client")}}
	case 1:
		p.Spec.Selector = &typeapi.WorkloadSelector{}
	}
	p.Spec.Action = oneOf(r, securityapi.AuthorizationPolicy_ALLOW, securityapi.AuthorizationPolicy_DENY,
		securityapi.AuthorizationPolicy_AUDIT, securityapi.AuthorizationPolicy_CUSTOM)
	if p.Spec.Action == securityapi.AuthorizationPolicy_CUSTOM {
		p.Spec.ActionDetail = &securityapi.AuthorizationPolicy_Provider{Provider: &securityapi.AuthorizationPolicy_ExtensionProvider{Name: "ext-authz"}}
	}
	rule := &securityapi.Rule{}
	if r.IntN(2) == 0 {
		rule.From = []*securityapi.Rule_From{{Source: &securityapi.Source{Principals: []string{oneOf(r, "cluster.local/ns/rb/sa/default", "*")}}}}
	}
	if r.IntN(2) == 0 {
		op := &securityapi.Operation{Ports: []string{oneOf(r, "8080", "9090")}}
		if r.IntN(2) == 0 {
			op.Paths = []string{"/admin"}
		}
		rule.To = []*securityapi.Rule_To{{Operation: op}}
	}
	if r.IntN(5) > 0 {
		p.Spec.Rules = []*securityapi.Rule{rule}
	}
	if r.IntN(6) == 0 {
		p.Annotations = map[string]string{securitypolicy.AnnotationDryRun: "true"}
	}
	return "AuthorizationPolicy " + ns + "/" + name, p
}

func (w *world) peerAuthentication(r *rand.Rand) (string, any) {
	ns := oneOf(r, "ra", "istio-system")
	name := oneOf(r, "default", "workload")
	pa := &securityv1.PeerAuthentication{ObjectMeta: w.meta(ns, name)}
	modes := []securityapi.PeerAuthentication_MutualTLS_Mode{securityapi.PeerAuthentication_MutualTLS_STRICT,
		securityapi.PeerAuthentication_MutualTLS_PERMISSIVE, securityapi.PeerAuthentication_MutualTLS_DISABLE,
		securityapi.PeerAuthentication_MutualTLS_UNSET}
	pa.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: oneOf(r, modes...)}
	if name == "workload" {
		pa.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}}
		if r.IntN(2) == 0 {
			pa.Spec.PortLevelMtls = map[uint32]*securityapi.PeerAuthentication_MutualTLS{8080: {Mode: oneOf(r, modes...)}}
		}
	}
	return "PeerAuthentication " + ns + "/" + name, pa
}

func (w *world) destinationRule(r *rand.Rand) (string, any) {
	dr := &networkingv1.DestinationRule{ObjectMeta: w.meta("ra", "a")}
	dr.Spec.Host = "a.ra.svc.cluster.local"
	if r.IntN(3) > 0 {
		dr.Spec.Subsets = []*networkingapi.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}, {Name: "front", Labels: map[string]string{"tier": "front"}}}
	}
	if r.IntN(2) == 0 {
		dr.Spec.TrafficPolicy = &networkingapi.TrafficPolicy{Tls: &networkingapi.ClientTLSSettings{Mode: oneOf(r, networkingapi.ClientTLSSettings_ISTIO_MUTUAL, networkingapi.ClientTLSSettings_DISABLE)}}
	}
	return "DestinationRule ra/a", dr
}

func (w *world) virtualService(r *rand.Rand) (string, any) {
	vs := &networkingv1.VirtualService{ObjectMeta: w.meta("ra", "a")}
	vs.Spec.Hosts = []string{"a.ra.svc.cluster.local"}
	route := &networkingapi.HTTPRoute{Route: []*networkingapi.HTTPRouteDestination{
		{Destination: &networkingapi.Destination{Host: "a.ra.svc.cluster.local", Subset: oneOf(r, "v1", "front", "")}, Weight: 80},
		{Destination: &networkingapi.Destination{Host: oneOf(r, "a.ra.svc.cluster.local", "b.ra.svc.cluster.local")}, Weight: 20},
	}}
	if r.IntN(2) == 0 {
		route.Timeout = durationpb.New(time.Duration(1+r.IntN(3)) * time.Second)
	}
	vs.Spec.Http = []*networkingapi.HTTPRoute{route}
	return "VirtualService ra/a", vs
}

// sidecarResource scopes the proxies' namespace.
func (w *world) sidecarResource(r *rand.Rand) (string, any) {
	sc := &networkingv1.Sidecar{ObjectMeta: w.meta(w.system, "default")}
	sc.Spec.Egress = []*networkingapi.IstioEgressListener{{Hosts: []string{oneOf(r, "./*", "ra/*", "rb/*", "*/*")}}}
	return "Sidecar " + w.system + "/default", sc
}

func (w *world) serviceEntry(r *rand.Rand) (string, any) {
	se := &networkingv1.ServiceEntry{ObjectMeta: w.meta("rb", "ext")}
	se.Spec.Hosts = []string{"ext.example.com"}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "tls", Protocol: oneOf(r, "TLS", "HTTPS", "TCP")}}
	se.Spec.Location = oneOf(r, networkingapi.ServiceEntry_MESH_EXTERNAL, networkingapi.ServiceEntry_MESH_INTERNAL)
	switch r.IntN(3) {
	case 0:
		se.Spec.Resolution = networkingapi.ServiceEntry_DNS
	case 1:
		se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
		se.Spec.Addresses = []string{"240.0.0.10"}
		se.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.4.0.1", Labels: map[string]string{"app": "b", "version": oneOf(r, "v1", "v2")}}}
	default:
		se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
		se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "b"}}
	}
	return "ServiceEntry rb/ext", se
}

func (w *world) workloadEntry(r *rand.Rand) (string, any) {
	we := &networkingv1.WorkloadEntry{ObjectMeta: w.meta("rb", "vm-1")}
	we.Spec.Address = "10.5.0.1"
	we.Spec.Labels = map[string]string{"app": "b", "version": oneOf(r, "v1", "v2")}
	we.Spec.ServiceAccount = oneOf(r, "default", "vm")
	return "WorkloadEntry rb/vm-1", we
}

// kindOrder is the order a rebuild applies kinds in.
var kindOrder = []string{"Namespace", "Node", "Gateway", "Service", "EndpointSlice", "Pod", "ServiceEntry", "WorkloadEntry",
	"AuthorizationPolicy", "PeerAuthentication", "DestinationRule", "VirtualService", "Sidecar"}

// applyAll gives x every object of the world, telling changed (if not
// nil) what each did.
func (w *world) applyAll(x *index.Index, changed func(index.ChangeSet)) {
	for _, kind := range kindOrder {
		for _, k := range slices.Sorted(maps.Keys(w.objects)) {
			if strings.HasPrefix(k, kind+" ") {
				cs := w.apply(x, k, w.objects[k])
				if changed != nil {
					changed(cs)
				}
			}
		}
	}
}

// populate creates every namespace, node, pod and Service of the world,
// the waypoint and the DestinationRule, so that events from the first
// one on change something that is there.
func (w *world) populate(r *rand.Rand) {
	want := len(worldNamespaces) + 1 + len(worldNodes) + len(w.pods()) + len(w.services()) + 2
	for len(w.objects) < want {
		for _, make := range []func(*rand.Rand) (string, any){w.namespace, w.node, w.pod, w.service, w.gateway, w.destinationRule} {
			if k, obj := make(r); w.objects[k] == nil {
				w.objects[k] = obj
			}
		}
	}
}

// apply gives x the object under k, or deletes it (obj nil), as the
// informers do.
func (w *world) apply(x *index.Index, k string, obj any) index.ChangeSet {
	kind, nsName, _ := strings.Cut(k, " ")
	ns, name, _ := strings.Cut(nsName, "/")
	if obj == nil {
		switch kind {
		case "Namespace":
			return x.DeleteNamespace(name)
		case "Node":
			return x.DeleteNode(name)
		case "Pod":
			return x.DeletePod(ns, name)
		case "Service":
			return x.DeleteService(ns, name)
		case "EndpointSlice":
			return x.DeleteEndpointSlice(ns, name)
		case "Gateway":
			return x.DeleteGateway(ns, name)
		case "AuthorizationPolicy":
			return x.DeleteAuthorizationPolicy(ns, name)
		case "PeerAuthentication":
			return x.DeletePeerAuthentication(ns, name)
		case "DestinationRule":
			return x.DeleteDestinationRule(ns, name)
		case "VirtualService":
			return x.DeleteVirtualService(ns, name)
		case "Sidecar":
			return x.DeleteSidecar(ns, name)
		case "ServiceEntry":
			return x.DeleteServiceEntry(ns, name)
		case "WorkloadEntry":
			return x.DeleteWorkloadEntry(ns, name)
		}
		panic("no kind " + kind)
	}
	switch o := obj.(type) {
	case *corev1.Namespace:
		return x.UpsertNamespace(o)
	case *corev1.Node:
		return x.UpsertNode(o)
	case *corev1.Pod:
		return x.UpsertPod(o)
	case *corev1.Service:
		return x.UpsertService(o)
	case *discoveryv1.EndpointSlice:
		return x.UpsertEndpointSlice(o)
	case *gatewayv1.Gateway:
		return x.UpsertGateway(o)
	case *securityv1.AuthorizationPolicy:
		return x.UpsertAuthorizationPolicy(o)
	case *securityv1.PeerAuthentication:
		return x.UpsertPeerAuthentication(o)
	case *networkingv1.DestinationRule:
		return x.UpsertDestinationRule(o)
	case *networkingv1.VirtualService:
		return x.UpsertVirtualService(o)
	case *networkingv1.Sidecar:
		return x.UpsertSidecar(o)
	case *networkingv1.ServiceEntry:
		return x.UpsertServiceEntry(o)
	case *networkingv1.WorkloadEntry:
		return x.UpsertWorkloadEntry(o)
	}
	panic(fmt.Sprintf("no kind %T", obj))
}
