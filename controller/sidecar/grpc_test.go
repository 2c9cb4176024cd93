package sidecar

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	goldenfile "github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// validator is what every generated Envoy resource implements.
type validator interface{ ValidateAll() error }

func svc(ns, name string, vip string, ports ...uint32) *workloadapi.Address {
	s := &workloadapi.Service{Name: name, Namespace: ns, Hostname: name + "." + ns + ".svc.cluster.local"}
	if vip != "" {
		s.Addresses = []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}}
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, &workloadapi.Port{ServicePort: p, TargetPort: p + 1000, AppProtocol: workloadapi.AppProtocol_GRPC})
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

func pod(ns, name, ip, zone string, services map[string][]uint32) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid: workloadapi.PodUID("Kubernetes", ns, name), Name: name, Namespace: ns,
		Addresses:      [][]byte{netip.MustParseAddr(ip).AsSlice()},
		ServiceAccount: name[:len(name)-3], WorkloadName: name[:len(name)-3], CanonicalName: "reviews", CanonicalRevision: name[len(name)-2:],
		Services: map[string]*workloadapi.PortList{},
	}
	if zone != "" {
		w.Locality = &workloadapi.Locality{Region: "r1", Zone: zone}
	}
	for key, ports := range services {
		pl := &workloadapi.PortList{}
		for _, p := range ports {
			pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: p, TargetPort: p + 1000})
		}
		w.Services[key] = pl
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

func withProtocol(a *workloadapi.Address, p workloadapi.AppProtocol) *workloadapi.Address {
	for _, port := range a.GetService().GetPorts() {
		port.AppProtocol = p
	}
	return a
}

func entryService(ns, name, host string, port uint32) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: name, Namespace: ns, Hostname: host, Ports: []*workloadapi.Port{{ServicePort: port, TargetPort: port}},
	}}}
}

// entry is a ServiceEntry's inline endpoint, named as the workload table
// names it.
func entry(ns, name, ip, sa string, services map[string][]uint32) *workloadapi.Address {
	a := pod(ns, name+"-xx", ip, "", services)
	w := a.GetWorkload()
	w.Uid = workloadapi.ServiceEntryUID("Kubernetes", ns, name, ip)
	w.Name, w.WorkloadName, w.CanonicalName, w.CanonicalRevision, w.ServiceAccount = name, name, name, "latest", sa
	return a
}

// unhealthy marks a workload not ready.
func unhealthy(a *workloadapi.Address) *workloadapi.Address {
	a.GetWorkload().Status = workloadapi.WorkloadStatus_UNHEALTHY
	return a
}

func meta(ns, name string, age time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-age))}
}

// testMesh: reviews (three versions over two zones) and ratings (one
// ready pod, one not ready, one terminating) in "default", a TCP service,
// a headless one and a ServiceEntry host; a VirtualService splitting
// reviews by header and weight, a DestinationRule with subsets (v2 hashed
// on the source address), one for ratings with outlier detection and a
// port-level hash, STRICT mutual TLS in "default".
func testMesh() *Mesh {
	reviews := map[string][]uint32{"default/reviews.default.svc.cluster.local": {9080}}
	labels := map[string]map[string]string{
		workloadapi.PodUID("Kubernetes", "default", "reviews-v1"): {"app": "reviews", "version": "v1", tlsModeLabel: "istio"},
		workloadapi.PodUID("Kubernetes", "default", "reviews-v2"): {"app": "reviews", "version": "v2", tlsModeLabel: "istio"},
		workloadapi.PodUID("Kubernetes", "default", "reviews-v3"): {"app": "reviews", "version": "v3"},
	}
	return NewMesh(Inputs{
		Addresses: []*workloadapi.Address{
			svc("default", "reviews", "10.96.0.10", 9080),
			svc("default", "ratings", "10.96.0.11", 9080, 9090),
			pod("default", "reviews-v1", "10.244.1.1", "z1", reviews),
			pod("default", "reviews-v2", "10.244.1.2", "z1", reviews),
			pod("default", "reviews-v3", "10.244.2.3", "z2", reviews),
			pod("default", "ratings-v1", "10.244.3.1", "", map[string][]uint32{"default/ratings.default.svc.cluster.local": {9080, 9090}}),
			unhealthy(pod("default", "ratings-v2", "10.244.3.2", "", map[string][]uint32{"default/ratings.default.svc.cluster.local": {9080, 9090}})),
			unhealthy(pod("default", "ratings-v3", "10.244.3.3", "", map[string][]uint32{"default/ratings.default.svc.cluster.local": {9080, 9090}})),
			withProtocol(svc("default", "mongo", "10.96.0.12", 27017), workloadapi.AppProtocol_TCP),
			svc("default", "reviews-headless", "", 9080),
			// A ServiceEntry host with an inline endpoint and a selected
			// pod that is not ready.
			entryService("default", "ext", "ext.example.com", 80),
			entry("default", "ext", "10.250.0.1", "ext-sa", map[string][]uint32{"default/ext.example.com": {80}}),
			unhealthy(pod("default", "ext-pod", "10.244.4.1", "", map[string][]uint32{"default/ext.example.com": {80}})),
		},
		Entry: func(uid string) *EntryEndpoint {
			if uid == workloadapi.ServiceEntryUID("Kubernetes", "default", "ext", "10.250.0.1") {
				return &EntryEndpoint{Workload: "ext-0", CanonicalName: "ext-0", CanonicalRevision: "latest"}
			}
			return nil
		},
		Labels:      func(uid string) map[string]string { return labels[uid] },
		Terminating: func(uid string) bool { return uid == workloadapi.PodUID("Kubernetes", "default", "ratings-v3") },
		VirtualServices: []*networkingv1.VirtualService{{
			ObjectMeta: meta("default", "reviews", time.Hour),
			Spec: networkingapi.VirtualService{
				Hosts: []string{"reviews"},
				Http: []*networkingapi.HTTPRoute{
					{
						Name: "jason",
						Match: []*networkingapi.HTTPMatchRequest{{Name: "user", Headers: map[string]*networkingapi.StringMatch{
							"end-user": {MatchType: &networkingapi.StringMatch_Exact{Exact: "jason"}},
							"x-any":    {MatchType: &networkingapi.StringMatch_Prefix{Prefix: ""}},
							"x-star":   {MatchType: &networkingapi.StringMatch_Regex{Regex: "*"}},
						}, QueryParams: map[string]*networkingapi.StringMatch{
							"b": {MatchType: &networkingapi.StringMatch_Regex{Regex: "[0-9]+"}},
							"a": {},
						}}},
						Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "reviews", Subset: "v2"}}},
						Fault: &networkingapi.HTTPFaultInjection{
							Delay: &networkingapi.HTTPFaultInjection_Delay{
								HttpDelayType: &networkingapi.HTTPFaultInjection_Delay_FixedDelay{FixedDelay: durationpb.New(time.Second)},
								Percentage:    &networkingapi.Percent{Value: 5.5},
							},
							Abort: &networkingapi.HTTPFaultInjection_Abort{
								ErrorType:  &networkingapi.HTTPFaultInjection_Abort_GrpcStatus{GrpcStatus: "UNAVAILABLE"},
								Percentage: &networkingapi.Percent{Value: 10},
							},
						},
					},
					{
						Name:    "split",
						Timeout: durationpb.New(3 * time.Second),
						Retries: &networkingapi.HTTPRetry{Attempts: 3, RetryOn: "unavailable,503"},
						Route: []*networkingapi.HTTPRouteDestination{
							{Destination: &networkingapi.Destination{Host: "reviews", Subset: "v1"}, Weight: 80},
							{Destination: &networkingapi.Destination{Host: "reviews.default.svc.cluster.local", Subset: "v3"}, Weight: 20},
							{Destination: &networkingapi.Destination{Host: "reviews", Subset: "v2"}, Weight: 0},
						},
					},
					{Name: "unreachable", Route: []*networkingapi.HTTPRouteDestination{
						{Destination: &networkingapi.Destination{Host: "ratings"}, Weight: 100},
						{Destination: &networkingapi.Destination{Host: "reviews"}},
					}},
				},
			},
		}},
		DestinationRules: []*networkingv1.DestinationRule{{
			ObjectMeta: meta("default", "reviews", time.Hour),
			Spec: networkingapi.DestinationRule{
				Host: "reviews",
				TrafficPolicy: &networkingapi.TrafficPolicy{
					LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_LEAST_REQUEST}},
				},
				Subsets: []*networkingapi.Subset{
					{Name: "v1", Labels: map[string]string{"version": "v1"}},
					{Name: "v2", Labels: map[string]string{"version": "v2"}, TrafficPolicy: &networkingapi.TrafficPolicy{
						Tls:            &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_ISTIO_MUTUAL},
						ConnectionPool: &networkingapi.ConnectionPoolSettings{Http: &networkingapi.ConnectionPoolSettings_HTTPSettings{Http2MaxRequests: 100}},
						LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{
							ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_UseSourceIp{UseSourceIp: true}},
						}},
					}},
					{Name: "v3", Labels: map[string]string{"version": "v3"}},
				},
			},
		}, {
			// ratings: hashed on a header on 9090 only; on 9080 unhealthy
			// endpoints are withheld.
			ObjectMeta: meta("default", "ratings", time.Hour),
			Spec: networkingapi.DestinationRule{
				Host: "ratings",
				TrafficPolicy: &networkingapi.TrafficPolicy{
					OutlierDetection: &networkingapi.OutlierDetection{MinHealthPercent: 50},
					PortLevelSettings: []*networkingapi.TrafficPolicy_PortTrafficPolicy{{
						Port:             &networkingapi.PortSelector{Number: 9090},
						OutlierDetection: &networkingapi.OutlierDetection{},
						LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{
							ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName{HttpHeaderName: "x-user"}},
						}},
					}},
				},
			},
		}},
		PeerAuthentications: []*securityv1.PeerAuthentication{{
			ObjectMeta: meta("default", "strict", time.Hour),
			Spec: securityapi.PeerAuthentication{
				Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "reviews"}},
				Mtls:     &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT},
			},
		}},
		AuthorizationPolicies: testAuthorizationPolicies(),
	})
}

// testAuthorizationPolicies: for reviews, a mesh-wide DENY from
// "untrusted", an ALLOW of productpage's reads, and an allow-nothing
// policy, and for reviews v1 a CUSTOM policy on /admin* (enforced as a
// DENY); policies that do not apply to reviews (another selector, another
// namespace, dry run, targetRefs) are left out.
func testAuthorizationPolicies() []*securityv1.AuthorizationPolicy {
	dryRun := meta("default", "dry-run", time.Hour)
	dryRun.Annotations = map[string]string{"istio.io/dry-run": "true"}
	return []*securityv1.AuthorizationPolicy{
		{
			ObjectMeta: meta("istio-system", "deny-untrusted", time.Hour),
			Spec: securityapi.AuthorizationPolicy{
				Action: securityapi.AuthorizationPolicy_DENY,
				Rules:  []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{"untrusted"}}}}}},
			},
		},
		{
			ObjectMeta: meta("default", "reviews-readers", time.Hour),
			Spec: securityapi.AuthorizationPolicy{
				Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "reviews"}},
				Rules: []*securityapi.Rule{{
					From: []*securityapi.Rule_From{{Source: &securityapi.Source{Principals: []string{"cluster.local/ns/default/sa/productpage"}}}},
					To:   []*securityapi.Rule_To{{Operation: &securityapi.Operation{Paths: []string{"/reviews.Reviews/Get*"}, Ports: []string{"10080"}}}},
					When: []*securityapi.Condition{{Key: "request.headers[x-tenant]", Values: []string{"a", "b"}}},
				}},
			},
		},
		{
			ObjectMeta: meta("default", "allow-nothing", time.Hour),
			Spec:       securityapi.AuthorizationPolicy{Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"version": "v1"}}},
		},
		{
			ObjectMeta: meta("default", "ratings-only", time.Hour),
			Spec: securityapi.AuthorizationPolicy{
				Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "ratings"}},
				Action:   securityapi.AuthorizationPolicy_DENY,
				Rules:    []*securityapi.Rule{{}},
			},
		},
		{ObjectMeta: meta("other", "deny-all", time.Hour), Spec: securityapi.AuthorizationPolicy{Action: securityapi.AuthorizationPolicy_DENY, Rules: []*securityapi.Rule{{}}}},
		{ObjectMeta: dryRun, Spec: securityapi.AuthorizationPolicy{Action: securityapi.AuthorizationPolicy_DENY, Rules: []*securityapi.Rule{{}}}},
		{ObjectMeta: meta("default", "custom", time.Hour), Spec: securityapi.AuthorizationPolicy{
			Selector:     &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "reviews", "version": "v1"}},
			Action:       securityapi.AuthorizationPolicy_CUSTOM,
			ActionDetail: &securityapi.AuthorizationPolicy_Provider{Provider: &securityapi.AuthorizationPolicy_ExtensionProvider{Name: "ext-authz"}},
			Rules:        []*securityapi.Rule{{To: []*securityapi.Rule_To{{Operation: &securityapi.Operation{Paths: []string{"/admin*"}}}}}},
		}},
		{
			ObjectMeta: meta("default", "waypoint", time.Hour),
			Spec: securityapi.AuthorizationPolicy{
				TargetRefs: []*typeapi.PolicyTargetReference{{Kind: "Service", Name: "reviews"}},
				Action:     securityapi.AuthorizationPolicy_DENY, Rules: []*securityapi.Rule{{}},
			},
		},
	}
}

// TestGRPCResourcesGolden: what a proxyless client in "default" gets for
// the names it would ask for, in testdata/grpc.golden; every resource
// passes go-control-plane's validation.
func TestGRPCResourcesGolden(t *testing.T) {
	m := testMesh()
	client := Proxy{Namespace: "default", Labels: map[string]string{"app": "productpage"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.9.9")}}
	server := Proxy{Namespace: "default", Labels: map[string]string{"app": "reviews", "version": "v1", tlsModeLabel: "istio"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.1")}}
	clusters := []string{
		"outbound|9080||reviews.default.svc.cluster.local", "outbound|9080|v1|reviews.default.svc.cluster.local",
		"outbound|9080|v2|reviews.default.svc.cluster.local", "outbound|9080|v3|reviews.default.svc.cluster.local",
		"outbound|9080|nosuch|reviews.default.svc.cluster.local", "outbound|9080||nosuch.default.svc.cluster.local",
		"outbound|9090||ratings.default.svc.cluster.local", "outbound|9080||ratings.default.svc.cluster.local",
		"outbound|9080|v1|ratings.default.svc.cluster.local", "outbound|80||ext.example.com",
	}
	got := map[string][]Named{
		"listeners": m.GRPCListeners(client, []string{"reviews:9080", "ratings.default.svc.cluster.local", "nosuch:80", "reviews:bad"}),
		"routes": m.GRPCRoutes(client, []string{
			"outbound|9080||reviews.default.svc.cluster.local", "outbound|9090||ratings.default.svc.cluster.local", "garbage",
			"outbound|27017||mongo.default.svc.cluster.local", "outbound|9080||reviews-headless.default.svc.cluster.local",
			"outbound|9080||nosuch.default.svc.cluster.local",
		}),
		"clusters":  m.GRPCClusters(client, clusters),
		"endpoints": m.Endpoints(client, clusters),
		"server listeners": m.GRPCListeners(server, []string{
			ServerListenerPrefix + "0.0.0.0:10080", ServerListenerPrefix + "10.244.1.1:10080",
			ServerListenerPrefix + "10.244.1.2:10080", ServerListenerPrefix + "0.0.0.0:9999",
		}),
	}
	var buf bytes.Buffer
	for _, kind := range []string{"listeners", "routes", "clusters", "endpoints", "server listeners"} {
		buf.WriteString("# " + kind + "\n")
		for _, n := range got[kind] {
			if err := n.Resource.(validator).ValidateAll(); err != nil {
				t.Errorf("%s %q: invalid: %v", kind, n.Name, err)
			}
			// grpc-go rejects a locality group without a locality.
			if cla, ok := n.Resource.(*endpointv3.ClusterLoadAssignment); ok {
				for _, g := range cla.GetEndpoints() {
					if g.GetLocality() == nil {
						t.Errorf("endpoints %q: a group without a locality", n.Name)
					}
				}
			}
			writeGoldenResource(t, &buf, n)
		}
	}
	goldenfile.Check(t, "grpc.golden", buf.Bytes())
}

// writeGoldenResource writes a resource as indented JSON, under the name
// it answers.
func writeGoldenResource(t *testing.T, buf *bytes.Buffer, n Named) {
	t.Helper()
	raw, err := protojson.Marshal(n.Resource)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(map[string]any{"name": n.Name, "resource": v}, "", "  ")
	buf.Write(out)
	buf.WriteString("\n")
}
