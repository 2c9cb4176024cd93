package sidecar

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// sharesMesh: services and pods in namespaces "a" and "b"; a Sidecar in
// "b" that scopes pods labelled role=scoped to their own namespace; a
// VirtualService in "a" whose route depends on the source label
// role=canary; a policy per namespace selecting app=web.
func sharesMesh() *Mesh { return NewMesh(sharesInputs()) }

// sharesInputs are sharesMesh's inputs, new on every call.
func sharesInputs() Inputs {
	web := func(ns string) map[string][]uint32 {
		return map[string][]uint32{ns + "/web." + ns + ".svc.cluster.local": {80}}
	}
	labels := map[string]map[string]string{}
	var addrs []*workloadapi.Address
	for _, ns := range []string{"a", "b"} {
		addrs = append(addrs, withProtocol(svc(ns, "web", "10.96."+map[string]string{"a": "0", "b": "1"}[ns]+".1", 80), workloadapi.AppProtocol_HTTP11))
		for i, ip := range []string{"10.0.0.1", "10.0.0.2"} {
			if ns == "b" {
				ip = fmt.Sprintf("10.1.0.%d", i+1)
			}
			name := fmt.Sprintf("web-v%d", i+1)
			addrs = append(addrs, pod(ns, name, ip, "", web(ns)))
			labels[workloadapi.PodUID("Kubernetes", ns, name)] = map[string]string{"app": "web", tlsModeLabel: "istio"}
		}
	}
	return Inputs{
		Addresses: addrs,
		Labels:    func(uid string) map[string]string { return labels[uid] },
		Sidecars:  []*networkingv1.Sidecar{sidecarResource("b", "scoped", time.Hour, map[string]string{"role": "scoped"}, "./*")},
		VirtualServices: []*networkingv1.VirtualService{{
			ObjectMeta: meta("a", "web", time.Hour),
			Spec: networkingapi.VirtualService{Hosts: []string{"web"}, Http: []*networkingapi.HTTPRoute{
				{
					Match: []*networkingapi.HTTPMatchRequest{{SourceLabels: map[string]string{"role": "canary"}}},
					Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "web"}, Weight: 100}},
					Fault: &networkingapi.HTTPFaultInjection{Abort: &networkingapi.HTTPFaultInjection_Abort{
						ErrorType: &networkingapi.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: 503}, Percentage: &networkingapi.Percent{Value: 100}}},
				},
				{Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "web"}}}},
			}},
		}},
		AuthorizationPolicies: []*securityv1.AuthorizationPolicy{{
			ObjectMeta: meta("a", "deny-web", time.Hour),
			Spec: securityapi.AuthorizationPolicy{
				Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "web"}},
				Action:   securityapi.AuthorizationPolicy_DENY,
				Rules:    []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"b"}}}}}},
			},
		}},
	}
}

// shareProxies are sidecars of sharesMesh, by name.
var shareProxies = map[string]Proxy{
	"a web-v1":        {Namespace: "a", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
	"a web-v2":        {Namespace: "a", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
	"a client":        {Namespace: "a", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}},
	"a canary client": {Namespace: "a", Labels: map[string]string{"app": "client", "role": "canary"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.10")}},
	"b web-v1":        {Namespace: "b", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}},
	"b scoped client": {Namespace: "b", Labels: map[string]string{"app": "client", "role": "scoped"}, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.9")}},
}

// shareTypes are the types and names a sharesMesh sidecar asks for.
var shareTypes = []struct {
	typ   string
	names []string
}{
	{ClusterType, nil},
	{ListenerType, nil},
	{EndpointType, []string{"outbound|80||web.a.svc.cluster.local", "outbound|80||web.b.svc.cluster.local"}},
	{RouteType, []string{"80"}},
}

// TestSharesEqualWhereKeysAre: two proxies whose shares have the same key
// are generated the same resources, so serving one's to the other is
// right; the property over every pair of proxies and share.
func TestSharesEqualWhereKeysAre(t *testing.T) {
	m := sharesMesh()
	for _, tt := range shareTypes {
		byKey := map[string][]Named{}
		owner := map[string]string{}
		for name, p := range shareProxies {
			for _, sh := range m.SidecarShares(p, tt.typ, tt.names) {
				got, id := sh.Generate(nil), sh.Key+"\x00"+sh.Name
				want, seen := byKey[id]
				if !seen {
					byKey[id], owner[id] = got, name
					continue
				}
				if diff := cmp.Diff(want, got, cmp.Comparer(proto.Equal)); diff != "" {
					t.Errorf("%s: %q and %q share key %q but differ (-%s +%s):\n%s", shortName(tt.typ), owner[id], name, id, owner[id], name, diff)
				}
			}
		}
	}
}

// TestSharesAreShared: which proxies share which part of their answer.
// Proxies of one namespace and Sidecar scope share their outbound
// clusters and listeners whatever their labels and addresses; their
// inbound sides are their own; routes differ only by the labels a
// VirtualService matches sources on.
func TestSharesAreShared(t *testing.T) {
	m := sharesMesh()
	key := func(p, typ string, i int, names ...string) string {
		return m.SidecarShares(shareProxies[p], typ, names)[i].Key
	}
	const outbound, own = 0, 1
	for _, tt := range []struct {
		name   string
		a, b   string
		typ    string
		share  int
		names  []string
		shared bool
	}{
		{"clusters: same namespace, other pods", "a web-v1", "a client", ClusterType, outbound, nil, true},
		{"clusters: other namespace", "a web-v1", "b web-v1", ClusterType, outbound, nil, false},
		{"clusters: another Sidecar scope", "b web-v1", "b scoped client", ClusterType, outbound, nil, false},
		{"clusters: inbound side, another address", "a web-v1", "a web-v2", ClusterType, own, nil, false},
		{"listeners: same namespace, other pods", "a web-v2", "a canary client", ListenerType, outbound, nil, true},
		{"listeners: inbound side, another address", "a web-v1", "a web-v2", ListenerType, own, nil, false},
		{"endpoints: same namespace", "a web-v1", "a canary client", EndpointType, 0, []string{"outbound|80||web.a.svc.cluster.local"}, true},
		{"endpoints: other namespace", "a web-v1", "b web-v1", EndpointType, 0, []string{"outbound|80||web.a.svc.cluster.local"}, false},
		{"routes: labels no route matches on", "a web-v1", "a client", RouteType, 0, []string{"80"}, true},
		{"routes: a source label a route matches on", "a client", "a canary client", RouteType, 0, []string{"80"}, false},
		{"routes: another Sidecar scope", "b web-v1", "b scoped client", RouteType, 0, []string{"80"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := key(tt.a, tt.typ, tt.share, tt.names...) == key(tt.b, tt.typ, tt.share, tt.names...); got != tt.shared {
				t.Errorf("%q and %q share: %v, want %v", tt.a, tt.b, got, tt.shared)
			}
		})
	}
}

// TestDepsTellWhatChanged: after a change, a share whose key and what its
// generation read (DepsOf its Reads) are as before generates what it did
// before (the property, over every proxy, type and share), and a change
// leaves the dependencies of what it does not touch alone: a pod's readiness only its service's endpoints, a
// VirtualService only routes.
func TestDepsTellWhatChanged(t *testing.T) {
	workload := func(in Inputs, ns, name string) *workloadapi.Workload {
		for _, a := range in.Addresses {
			if w := a.GetWorkload(); w.GetNamespace() == ns && w.GetName() == name {
				return w
			}
		}
		t.Fatalf("no workload %s/%s", ns, name)
		return nil
	}
	for _, tt := range []struct {
		name   string
		change func(in *Inputs)
		// changed are the shares whose dependencies change: "clusters",
		// "listeners", "routes", "endpoints" (every proxy's), "own" (every
		// proxy's inbound side), "own clusters", "own listeners",
		// "endpoints of <host>", "own of <proxy>", "own clusters of
		// <proxy>".
		changed []string
	}{
		{
			name:    "a pod of web.a not ready",
			change:  func(in *Inputs) { workload(*in, "a", "web-v1").Status = workloadapi.WorkloadStatus_UNHEALTHY },
			changed: []string{"endpoints of web.a", "own of a web-v1"},
		},
		{
			name: "a pod of web.b moves zone",
			change: func(in *Inputs) {
				workload(*in, "b", "web-v2").Locality = &workloadapi.Locality{Region: "r", Zone: "z9"}
			},
			changed: []string{"endpoints of web.b"},
		},
		{
			name: "a pod's labels",
			change: func(in *Inputs) {
				old := in.Labels
				in.Labels = func(uid string) map[string]string {
					if uid == workloadapi.PodUID("Kubernetes", "a", "web-v2") {
						return map[string]string{"app": "web", "version": "v2"}
					}
					return old(uid)
				}
			},
			changed: []string{"endpoints of web.a", "own of a web-v2"},
		},
		{
			name:    "a pod's service account: clusters' subject alt names",
			change:  func(in *Inputs) { workload(*in, "a", "web-v2").ServiceAccount = "other" },
			changed: []string{"clusters", "listeners", "routes", "endpoints", "own"},
		},
		{
			name: "a pod serves its service on another target port",
			change: func(in *Inputs) {
				workload(*in, "a", "web-v1").Services["a/web.a.svc.cluster.local"].Ports[0].TargetPort = 8081
			},
			changed: []string{"endpoints of web.a", "own of a web-v1"},
		},
		{
			name:    "a VirtualService",
			change:  func(in *Inputs) { in.VirtualServices[0].Spec.Http[1].Timeout = durationpb.New(time.Second) },
			changed: []string{"routes"},
		},
		{
			name: "a DestinationRule",
			change: func(in *Inputs) {
				in.DestinationRules = append(in.DestinationRules, &networkingv1.DestinationRule{ObjectMeta: meta("a", "web", time.Hour), Spec: networkingapi.DestinationRule{
					Host: "web", Subsets: []*networkingapi.Subset{{Name: "v2", Labels: map[string]string{"version": "v2"}}},
				}})
			},
			// The inbound clusters of the proxies that serve a service read
			// the DestinationRules.
			changed: []string{"clusters", "routes", "endpoints", "own clusters of a web-v1", "own clusters of a web-v2", "own clusters of b web-v1"},
		},
		{
			name: "a PeerAuthentication",
			change: func(in *Inputs) {
				in.PeerAuthentications = append(in.PeerAuthentications, &securityv1.PeerAuthentication{ObjectMeta: meta("a", "plain", time.Hour), Spec: securityapi.PeerAuthentication{
					Mtls: &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_DISABLE},
				}})
			},
			changed: []string{"endpoints", "own listeners"},
		},
		{
			name: "a Sidecar resource",
			change: func(in *Inputs) {
				in.Sidecars = append(in.Sidecars, sidecarResource("a", "default", time.Hour, nil, "b/*"))
			},
			// A Sidecar's inbound connection pool shapes the inbound
			// clusters of the workloads that serve.
			changed: []string{"clusters", "listeners", "routes", "own clusters of a web-v1", "own clusters of a web-v2", "own clusters of b web-v1"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := NewMesh(sharesInputs())
			changedIn := sharesInputs()
			tt.change(&changedIn)
			after := NewMesh(changedIn)
			for pname, p := range shareProxies {
				for _, st := range shareTypes {
					was, is := before.SidecarShares(p, st.typ, st.names), after.SidecarShares(p, st.typ, st.names)
					for i := range is {
						if was[i].Key != is[i].Key || was[i].Name != is[i].Name {
							continue // another share (a Sidecar resource scopes the proxy now)
						}
						var r Reads
						generated := was[i].Generate(&r)
						same := before.DepsOf(&r) == after.DepsOf(&r)
						if same {
							if diff := cmp.Diff(generated, is[i].Generate(nil), cmp.Comparer(proto.Equal)); diff != "" {
								t.Errorf("%s %s share %d: what it read is unchanged, what it generates is not (-before +after):\n%s", pname, shortName(st.typ), i, diff)
							}
						}
						kind := map[string]string{ClusterType: "clusters", ListenerType: "listeners", RouteType: "routes", EndpointType: "endpoints"}[st.typ]
						wantChanged := slices.Contains(tt.changed, kind)
						if IsWildcard(st.typ) && i == 1 {
							wantChanged = slices.ContainsFunc([]string{"own", "own " + kind, "own of " + pname, "own " + kind + " of " + pname}, func(s string) bool {
								return slices.Contains(tt.changed, s)
							})
						}
						if st.typ == EndpointType {
							host := strings.TrimSuffix(strings.Split(st.names[i], "|")[3], ".svc.cluster.local")
							wantChanged = wantChanged || slices.Contains(tt.changed, "endpoints of "+host)
						}
						if same == wantChanged {
							t.Errorf("%s %s share %d (%v): Deps changed %v, want %v", pname, shortName(st.typ), i, st.names, !same, wantChanged)
						}
					}
				}
			}
		})
	}
}

func shortName(typ string) string { return typ[len("type.googleapis.com/envoy.config."):] }

// TestAbsentSharesAreTheirNamesAlone: a share the Mesh has nothing under
// (Absent) generates what the same name generates in a mesh without any
// service, so a control plane that does not cache or hold it, and never
// tells its changes, misses nothing; and the names of sharesMesh's
// services are not absent. Over every proxy, both kinds of client, every
// type, and names real and made up.
func TestAbsentSharesAreTheirNamesAlone(t *testing.T) {
	m, empty := sharesMesh(), NewMesh(Inputs{})
	cluster := "outbound|80||web.a.svc.cluster.local"
	madeUp := []string{
		"outbound|81||web.a.svc.cluster.local", "outbound|80|v9|web.a.svc.cluster.local", "outbound|80||made-up.example.com",
		"inbound|80||web.a.svc.cluster.local", "outbound|0||web.a.svc.cluster.local", "outbound|080||web.a.svc.cluster.local", "garbage", "",
	}
	for _, tt := range []struct {
		name    string
		shares  func(m *Mesh, p Proxy, typ string, names []string) []Share
		typ     string
		present []string // for "a web-v1"
		absent  []string
	}{
		{"proxyless clusters", (*Mesh).GRPCShares, ClusterType, []string{cluster}, madeUp},
		{"proxyless endpoints", (*Mesh).GRPCShares, EndpointType, []string{cluster}, madeUp},
		{"proxyless routes", (*Mesh).GRPCShares, RouteType, []string{cluster}, madeUp},
		{"proxyless listeners", (*Mesh).GRPCShares, ListenerType,
			[]string{"web.a.svc.cluster.local:80", "web:80", "web", ServerListenerPrefix + "10.0.0.1:1080", ServerListenerPrefix + "0.0.0.0:1080", ServerListenerPrefix + "[::]:1080"},
			[]string{"web:81", "web:080", "made-up:80", "made-up", "web:x", ServerListenerPrefix + "10.0.0.1:1081", ServerListenerPrefix + "10.0.0.1:01080",
				ServerListenerPrefix + "[0::0]:1080", ServerListenerPrefix + "[::%eth0]:1080", ServerListenerPrefix + "10.9.9.9:1080", ServerListenerPrefix + "bogus", ""}},
		{"sidecar endpoints", (*Mesh).SidecarShares, EndpointType, []string{cluster}, madeUp},
		{"sidecar routes", (*Mesh).SidecarShares, RouteType, []string{"80", "9999"},
			[]string{"web.a.svc.cluster.local:80", "made-up:80", "web.a.svc.cluster.local:x", "0", "080", "garbage", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			names := append(slices.Clone(tt.present), tt.absent...)
			for pname, p := range shareProxies {
				got, placeholders := tt.shares(m, p, tt.typ, names), tt.shares(empty, p, tt.typ, names)
				for i, sh := range got {
					if !sh.IsAbsent() {
						continue
					}
					if diff := cmp.Diff(placeholders[i].Generate(nil), sh.Generate(nil), cmp.Comparer(proto.Equal)); diff != "" {
						t.Errorf("%s: %q is absent but not its name alone (-no services +sharesMesh):\n%s", pname, sh.Name, diff)
					}
				}
				if pname != "a web-v1" {
					continue
				}
				var gotAbsent []string
				for _, sh := range got {
					if sh.IsAbsent() {
						gotAbsent = append(gotAbsent, sh.Name)
					}
				}
				if diff := cmp.Diff(tt.absent, gotAbsent); diff != "" {
					t.Errorf("%s: absent names (-want +got):\n%s", pname, diff)
				}
			}
		})
	}
}
