package sidecar

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// regexes are the regular expressions of every RegexMatcher in m.
func regexes(m proto.Message) []string {
	var out []string
	var walk func(protoreflect.Message)
	walk = func(msg protoreflect.Message) {
		if re, ok := msg.Interface().(*matcherv3.RegexMatcher); ok {
			out = append(out, re.GetRegex())
		}
		msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message())
					return true
				})
			case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
	return out
}

// checkRouteConfigurations fails t for a route configuration Envoy or
// grpc-go would refuse: one go-control-plane's validation refuses, or with
// a regex that does not compile.
func checkRouteConfigurations(t *testing.T, rcs []Named) {
	t.Helper()
	for _, n := range rcs {
		if err := n.Resource.(validator).ValidateAll(); err != nil {
			t.Errorf("route configuration %q: Envoy would refuse it: %v", n.Name, err)
		}
		for _, re := range regexes(n.Resource) {
			if _, err := regexp.Compile(re); err != nil {
				t.Errorf("route configuration %q: regex %q does not compile: %v", n.Name, re, err)
			}
		}
	}
}

// routeConfigs names the VirtualServices (namespace/name) whose routes
// a route configuration carries.
func routeConfigs(rc *routev3.RouteConfiguration) map[string]int {
	out := map[string]int{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			path := r.GetMetadata().GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue()
			if ns, rest, ok := strings.Cut(strings.TrimPrefix(path, "/apis/networking.istio.io/v1/namespaces/"), "/virtual-service/"); ok {
				out[ns+"/"+rest]++
			}
		}
	}
	return out
}

func httpRoute(name string, m *networkingapi.HTTPMatchRequest, host string) *networkingapi.HTTPRoute {
	return &networkingapi.HTTPRoute{Name: name, Match: []*networkingapi.HTTPMatchRequest{m},
		Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: host}}}}
}

// TestBadRegexPoisonsNoOneElse is the attack of finding 4: a VirtualService
// in the author's own namespace with the URI regex "(", for a port that
// other namespaces' services share. The sidecars' route configuration of
// that port is one resource; had the regex reached it, Envoy would have
// refused all of it, and every sidecar of the mesh would have stopped
// taking route updates for the port. The route configuration must stay
// valid and keep the good VirtualService's routes (and the author's good
// route); only the bad route is left out.
func TestBadRegexPoisonsNoOneElse(t *testing.T) {
	t.Parallel()
	http := func(a *workloadapi.Address) *workloadapi.Address {
		return withProtocol(a, workloadapi.AppProtocol_HTTP11)
	}
	in := Inputs{
		Addresses: []*workloadapi.Address{
			http(svc("prod", "reviews", "10.96.1.10", 9080)),
			http(svc("attacker", "ratings", "10.96.1.11", 9080)),
			pod("prod", "reviews-v1", "10.244.1.10", "", map[string][]uint32{"prod/reviews.prod.svc.cluster.local": {9080}}),
			pod("attacker", "ratings-v1", "10.244.1.11", "", map[string][]uint32{"attacker/ratings.attacker.svc.cluster.local": {9080}}),
		},
		VirtualServices: []*networkingv1.VirtualService{
			{
				ObjectMeta: meta("prod", "reviews", time.Hour),
				Spec: networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{
					httpRoute("v2-users", &networkingapi.HTTPMatchRequest{Headers: map[string]*networkingapi.StringMatch{
						"end-user": {MatchType: &networkingapi.StringMatch_Regex{Regex: "^(jason|ana)$"}}}}, "reviews"),
					httpRoute("rest", nil, "reviews"),
				}},
			},
			{
				// The attacker's, newer: the order does not matter.
				ObjectMeta: meta("attacker", "ratings", time.Minute),
				Spec: networkingapi.VirtualService{Hosts: []string{"ratings"}, Http: []*networkingapi.HTTPRoute{
					httpRoute("poison", &networkingapi.HTTPMatchRequest{Uri: &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: "("}}}, "ratings"),
					httpRoute("fine", &networkingapi.HTTPMatchRequest{Uri: &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Prefix{Prefix: "/"}}}, "ratings"),
				}},
			},
		},
	}
	m := NewMesh(in)
	for _, p := range []Proxy{
		{Namespace: "client", HBONE: true},
		{Namespace: "prod", HBONE: true, IPs: sidecarProxy.IPs},
		{Namespace: "attacker", HBONE: true},
	} {
		rcs := m.GenerateSidecar(p, RouteType, []string{"9080"})
		if len(rcs) != 1 {
			t.Fatalf("proxy of %s: got %d route configurations, want 1", p.Namespace, len(rcs))
		}
		checkRouteConfigurations(t, rcs)
		got := routeConfigs(rcs[0].Resource.(*routev3.RouteConfiguration))
		if got["prod/reviews"] != 2 {
			t.Errorf("proxy of %s: %d routes of prod/reviews in route configuration 9080, want 2 (%v)", p.Namespace, got["prod/reviews"], got)
		}
		if got["attacker/ratings"] != 1 {
			t.Errorf("proxy of %s: %d routes of attacker/ratings, want 1: the good route stays, the bad one goes (%v)", p.Namespace, got["attacker/ratings"], got)
		}
		// A proxyless client's route configuration of the attacker's host.
		checkRouteConfigurations(t, m.Generate(Proxy{Namespace: p.Namespace}, RouteType, []string{"outbound|9080||ratings.attacker.svc.cluster.local"}))
	}
}

// attackMesh: two HTTP services on port 9080, prod/reviews with a good
// VirtualService and attacker/ratings, with vs and dr (nil for none) of
// the attacker's.
func attackMesh(vs *networkingv1.VirtualService, dr *networkingv1.DestinationRule, extra ...*workloadapi.Address) *Mesh {
	http := func(a *workloadapi.Address) *workloadapi.Address {
		return withProtocol(a, workloadapi.AppProtocol_HTTP11)
	}
	in := Inputs{
		Addresses: append([]*workloadapi.Address{
			http(svc("prod", "reviews", "10.96.1.10", 9080)),
			http(svc("attacker", "ratings", "10.96.1.11", 9080)),
			pod("prod", "reviews-v1", "10.244.1.10", "", map[string][]uint32{"prod/reviews.prod.svc.cluster.local": {9080}}),
			pod("attacker", "ratings-v1", "10.244.1.11", "", map[string][]uint32{"attacker/ratings.attacker.svc.cluster.local": {9080}}),
		}, extra...),
		VirtualServices: []*networkingv1.VirtualService{{
			ObjectMeta: meta("prod", "reviews", time.Hour),
			Spec: networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{
				httpRoute("v2-users", &networkingapi.HTTPMatchRequest{Headers: map[string]*networkingapi.StringMatch{
					"end-user": {MatchType: &networkingapi.StringMatch_Regex{Regex: "^(jason|ana)$"}}}}, "reviews"),
				httpRoute("rest", nil, "reviews"),
			}},
		}},
	}
	if vs != nil {
		in.VirtualServices = append(in.VirtualServices, vs)
	}
	if dr != nil {
		in.DestinationRules = append(in.DestinationRules, dr)
	}
	return NewMesh(in)
}

// TestBadDestinationRuleFailsClosed: a DestinationRule Istio refuses (a
// hash cookie without a name, which Envoy's route configuration refuses)
// shapes nothing: its host's routes carry no hash policy, the shared
// route configuration stays valid, and the proxies that would use the
// rule get no cluster of its host, rather than one without what it asked.
func TestBadDestinationRuleFailsClosed(t *testing.T) {
	t.Parallel()
	dr := &networkingv1.DestinationRule{
		ObjectMeta: meta("attacker", "ratings", time.Minute),
		Spec: networkingapi.DestinationRule{Host: "ratings", TrafficPolicy: &networkingapi.TrafficPolicy{
			Tls: &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_SIMPLE},
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{
				ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpCookie{
					HttpCookie: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HTTPCookie{Name: ""},
				}},
			}},
		}},
	}
	m := attackMesh(nil, dr)
	p := Proxy{Namespace: "client", HBONE: true}
	rcs := m.GenerateSidecar(p, RouteType, []string{"9080"})
	checkRouteConfigurations(t, rcs)
	if got := routeConfigs(rcs[0].Resource.(*routev3.RouteConfiguration))["prod/reviews"]; got != 2 {
		t.Errorf("%d routes of prod/reviews, want 2", got)
	}
	const ratings = "outbound|9080||ratings.attacker.svc.cluster.local"
	clusters := namedNames(m.SidecarClusters(p))
	if slices.Contains(clusters, ratings) {
		t.Errorf("the sidecar got cluster %s without the TLS its invalid rule asked for", ratings)
	}
	if !slices.Contains(clusters, "outbound|9080||reviews.prod.svc.cluster.local") {
		t.Errorf("the sidecar lost prod's cluster: %v", clusters)
	}
	if got := m.Generate(Proxy{Namespace: "client"}, ClusterType, []string{ratings}); len(got) != 0 {
		t.Errorf("a gRPC client got cluster %s of an invalid rule", ratings)
	}
	if msg := DestinationRuleProblem(dr); !strings.Contains(msg, `no cluster for host "ratings"`) || !strings.Contains(msg, "name required for HttpCookie") {
		t.Errorf("DestinationRuleProblem() = %q", msg)
	}
}

// TestBadServiceEntryHost: a ServiceEntry host Istio refuses never
// becomes a domain of the shared route configuration; nor do two hosts
// that differ only in case both (Envoy compares domains without case).
func TestBadServiceEntryHost(t *testing.T) {
	t.Parallel()
	http := func(a *workloadapi.Address) *workloadapi.Address {
		return withProtocol(a, workloadapi.AppProtocol_HTTP11)
	}
	m := attackMesh(nil, nil,
		http(entryService("attacker", "bad", "bad\nhost.example.com", 9080)),
		http(entryService("attacker", "upper", "API.example.com", 9080)),
		http(entryService("other", "lower", "api.example.com", 9080)),
	)
	rcs := m.GenerateSidecar(Proxy{Namespace: "client", HBONE: true}, RouteType, []string{"9080"})
	checkRouteConfigurations(t, rcs)
	for _, vh := range rcs[0].Resource.(*routev3.RouteConfiguration).GetVirtualHosts() {
		if strings.Contains(vh.GetName(), "bad") {
			t.Errorf("virtual host %q of a refused host", vh.GetName())
		}
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: meta("attacker", "bad", 0), Spec: networkingapi.ServiceEntry{Hosts: []string{"ok.example.com", "a*b.example.com"}}}
	if got, want := ServiceEntryProblem(se), `host "a*b.example.com" is not sent to sidecars: domain name "a*b.example.com" invalid (label "a*b" invalid)`; got != want {
		t.Errorf("ServiceEntryProblem() = %q, want %q", got, want)
	}
}

// TestVirtualServiceProblem: what sidecars do not get of a VirtualService
// is said route by route, and a VirtualService refused whole is said so.
func TestVirtualServiceProblem(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		hosts  []string
		routes []*networkingapi.HTTPRoute
		want   string
	}{
		{name: "good", hosts: []string{"r"}, routes: []*networkingapi.HTTPRoute{httpRoute("a", nil, "r")}},
		{
			name: "presence matches Canopy translates", hosts: []string{"r"},
			routes: []*networkingapi.HTTPRoute{httpRoute("a", &networkingapi.HTTPMatchRequest{
				Headers: map[string]*networkingapi.StringMatch{"x": {MatchType: &networkingapi.StringMatch_Prefix{}}, "y": {MatchType: &networkingapi.StringMatch_Regex{Regex: "*"}}},
			}, "r")},
		},
		{
			name: "one bad route", hosts: []string{"r"},
			routes: []*networkingapi.HTTPRoute{
				httpRoute("a", nil, "r"),
				httpRoute("b", &networkingapi.HTTPMatchRequest{Uri: &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: "("}}}, "r"),
			},
			want: `sidecars do not get HTTP route 1 ("b"): "uri": error parsing regexp: missing closing ): ` + "`(`" + `; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)`,
		},
		{
			name: "bad host", hosts: []string{"a*b.example.com"}, routes: []*networkingapi.HTTPRoute{httpRoute("a", nil, "r")},
			want: `sidecars do not get this VirtualService: domain name "a*b.example.com" invalid (label "a*b" invalid)`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := &networkingv1.VirtualService{ObjectMeta: meta("attacker", "vs", 0), Spec: networkingapi.VirtualService{Hosts: tt.hosts, Http: tt.routes}}
			if got := VirtualServiceProblem(vs); got != tt.want {
				t.Errorf("VirtualServiceProblem() = %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzSharedRoutes: whatever an author writes in the fields of a route
// that reach the shared route configuration, it stays valid for Envoy and
// grpc-go and keeps the other VirtualService's routes.
func FuzzSharedRoutes(f *testing.F) {
	f.Add("(", "x-user", "a+", "q", "/rewrite", "host", int32(5), int64(1), int32(0), 50.0, uint32(503), "5xx")
	f.Add("^/api$", "x user", "*", "", "/a\n", "", int32(0), int64(0), int32(-1), 200.0, uint32(600), "sometimes")
	f.Add("a{1001}", ":path", "", "q\x00", "", "evil\r\n", int32(1), int64(-1), int32(2147483647), -1.0, uint32(200), "")
	f.Fuzz(func(t *testing.T, uriRegex, header, headerRegex, query, rewriteURI, authority string, timeoutNanos int32, timeoutSeconds int64, weight int32, percent float64, status uint32, retryOn string) {
		hr := &networkingapi.HTTPRoute{
			Name: "fuzzed",
			Match: []*networkingapi.HTTPMatchRequest{{
				Uri:         &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: uriRegex}},
				Headers:     map[string]*networkingapi.StringMatch{header: {MatchType: &networkingapi.StringMatch_Regex{Regex: headerRegex}}},
				QueryParams: map[string]*networkingapi.StringMatch{query: {MatchType: &networkingapi.StringMatch_Prefix{Prefix: headerRegex}}},
			}},
			Route: []*networkingapi.HTTPRouteDestination{
				{Destination: &networkingapi.Destination{Host: "ratings"}, Weight: weight},
				{Destination: &networkingapi.Destination{Host: "ratings"}, Weight: weight},
				{Destination: &networkingapi.Destination{Host: "ratings"}, Weight: weight},
			},
			Rewrite: &networkingapi.HTTPRewrite{Uri: rewriteURI, Authority: authority},
			Timeout: &durationpb.Duration{Seconds: timeoutSeconds, Nanos: timeoutNanos},
			Retries: &networkingapi.HTTPRetry{Attempts: 2, RetryOn: retryOn},
			Fault: &networkingapi.HTTPFaultInjection{
				Abort: &networkingapi.HTTPFaultInjection_Abort{
					Percentage: &networkingapi.Percent{Value: percent},
					ErrorType:  &networkingapi.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: int32(status)},
				},
				Delay: &networkingapi.HTTPFaultInjection_Delay{
					Percentage:    &networkingapi.Percent{Value: percent},
					HttpDelayType: &networkingapi.HTTPFaultInjection_Delay_FixedDelay{FixedDelay: &durationpb.Duration{Seconds: timeoutSeconds, Nanos: timeoutNanos}},
				},
			},
		}
		vs := &networkingv1.VirtualService{ObjectMeta: meta("attacker", "ratings", time.Minute),
			Spec: networkingapi.VirtualService{Hosts: []string{"ratings"}, Http: []*networkingapi.HTTPRoute{hr}}}
		m := attackMesh(vs, nil)
		rcs := m.GenerateSidecar(Proxy{Namespace: "client", HBONE: true}, RouteType, []string{"9080"})
		checkRouteConfigurations(t, rcs)
		if got := routeConfigs(rcs[0].Resource.(*routev3.RouteConfiguration))["prod/reviews"]; got != 2 {
			t.Errorf("%d routes of prod/reviews, want 2", got)
		}
		checkRouteConfigurations(t, m.Generate(Proxy{Namespace: "client"}, RouteType, []string{"outbound|9080||ratings.attacker.svc.cluster.local"}))
	})
}
