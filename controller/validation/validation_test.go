package validation

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
)

// wantErr checks err against want: "" for none, else a part of its
// message.
func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("got error %q, want none", err)
	case want != "" && err == nil:
		t.Errorf("got no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("got error %q, want one containing %q", err, want)
	}
}

func regexURI(re string) *networkingapi.StringMatch {
	return &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Regex{Regex: re}}
}

func exact(s string) *networkingapi.StringMatch {
	return &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Exact{Exact: s}}
}

func prefix(s string) *networkingapi.StringMatch {
	return &networkingapi.StringMatch{MatchType: &networkingapi.StringMatch_Prefix{Prefix: s}}
}

func routeTo(host string) []*networkingapi.HTTPRouteDestination {
	return []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: host}}}
}

func TestRegex(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, re, want string
	}{
		{"simple", "^/api/v[0-9]+/.*$", ""},
		{"unbalanced", "(", "missing closing )"},
		{"empty", "", "should not be empty"},
		{"too long", strings.Repeat("a", MaxRegexLength+1), "max length allowed is 1024"},
		{"lookahead", "(?=a)", "invalid or unsupported Perl syntax"},
		{"repeat beyond RE2", "a{1001}", "invalid repeat count"},
		// Short, but its repeat makes a program beyond Envoy's limit.
		{"program too large", "(abcdefghijklmnopqrstuvwxyzabcdefgh){1000}", "regex program size"},
		{"program within limit", "(abcdefghij){1000}", ""},
		{"nested repeats beyond RE2", "(a{100}){100}", "invalid repeat count"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, Regex(tt.re, "uri"), tt.want)
		})
	}
}

func TestHost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		host, want string
	}{
		{"reviews.prod.svc.cluster.local", ""},
		{"*.example.com", ""},
		{"*", ""},
		{"*foo.example.com", ""},
		{"reviews", ""},
		{"a*b.example.com", `label "a*b" invalid`},
		{"foo.*.example.com", `label "*" invalid`},
		{"*.*.example.com", `label "*" invalid`},
		{"foo..com", `label "" invalid`},
		{"example.123", "cannot be all-numeric"},
		{"", "empty domain name"},
		{strings.Repeat("a.", 128) + "com", "too long"},
		{"-foo.com", `label "-foo" invalid`},
		{"foo\n.com", "invalid"},
	} {
		t.Run(tt.host, func(t *testing.T) {
			t.Parallel()
			wantErr(t, Host(tt.host), tt.want)
		})
	}
}

func TestHeaderName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, want string
	}{
		{"x-user", ""},
		{"X-User", ""},
		{":authority", ""},
		{"@request.auth.claims.group", ""},
		{"", "cannot be empty"},
		{"x user", "not a valid header name"},
		{"x-user\n", "not a valid header name"},
		{":foo", "not a valid header name"},
		{"x:y", "not a valid header name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, HeaderName(tt.name), tt.want)
		})
	}
}

func TestDurationPercentPort(t *testing.T) {
	t.Parallel()
	wantErr(t, Duration(durationpb.New(0)), "greater than 1ms")
	wantErr(t, Duration(&durationpb.Duration{Nanos: 500000}), "greater than 1ms")
	wantErr(t, Duration(&durationpb.Duration{Seconds: 1, Nanos: 1}), "ms precision")
	wantErr(t, Duration(&durationpb.Duration{Seconds: 1, Nanos: -1}), "invalid duration")
	wantErr(t, Duration(&durationpb.Duration{Seconds: 1 << 40}), "invalid duration")
	wantErr(t, Duration(durationpb.New(1500000000)), "")
	wantErr(t, Percentage(&networkingapi.Percent{Value: 100.5}), "neither 0.0")
	wantErr(t, Percentage(&networkingapi.Percent{Value: -1}), "neither 0.0")
	wantErr(t, Percentage(&networkingapi.Percent{Value: 0.00001}), "neither 0.0")
	wantErr(t, Percentage(&networkingapi.Percent{Value: 0.5}), "")
	wantErr(t, Percent(101), "not in range 0..100")
	wantErr(t, Port(0), "1..65535")
	wantErr(t, Port(65536), "1..65535")
	wantErr(t, Port(15001), "")
}

func TestVirtualService(t *testing.T) {
	t.Parallel()
	good := func() *networkingapi.HTTPRoute {
		return &networkingapi.HTTPRoute{
			Match: []*networkingapi.HTTPMatchRequest{{Uri: prefix("/api"), Headers: map[string]*networkingapi.StringMatch{"x-user": exact("a")}}},
			Route: routeTo("reviews"),
		}
	}
	for _, tt := range []struct {
		name string
		vs   *networkingapi.VirtualService
		// wantSpec and wantHTTP are parts of the messages of the spec's
		// and of each route's problems ("" for none).
		wantSpec string
		wantHTTP map[int]string
	}{
		{name: "good", vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{good()}}},
		{
			name: "bad regex in the second route",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{good(), {
				Match: []*networkingapi.HTTPMatchRequest{{Uri: regexURI("(")}}, Route: routeTo("reviews"),
			}}},
			wantHTTP: map[int]string{1: `"uri": error parsing regexp: missing closing ): ` + "`(`"},
		},
		{
			name:     "wildcard inside a label",
			vs:       &networkingapi.VirtualService{Hosts: []string{"a*b.example.com"}, Http: []*networkingapi.HTTPRoute{good()}},
			wantSpec: `domain name "a*b.example.com" invalid (label "a*b" invalid)`,
		},
		{
			name:     "mesh wildcard host",
			vs:       &networkingapi.VirtualService{Hosts: []string{"*"}, Http: []*networkingapi.HTTPRoute{good()}},
			wantSpec: "wildcard host * is not allowed",
		},
		{
			name:     "duplicate hosts",
			vs:       &networkingapi.VirtualService{Hosts: []string{"*.foo.com", "a.foo.com"}, Http: []*networkingapi.HTTPRoute{good()}},
			wantSpec: "duplicate hosts in virtual service",
		},
		{
			name:     "no routes",
			vs:       &networkingapi.VirtualService{Hosts: []string{"reviews"}},
			wantSpec: "http, tcp or tls must be provided",
		},
		{
			name: "bad header name and header regex",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Match: []*networkingapi.HTTPMatchRequest{{Headers: map[string]*networkingapi.StringMatch{"x y": regexURI("a++")}}},
				Route: routeTo("reviews"),
			}}},
			wantHTTP: map[int]string{0: "header name x y is not a valid header name"},
		},
		{
			name: "jwt claim routing on the mesh",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Match: []*networkingapi.HTTPMatchRequest{{Headers: map[string]*networkingapi.StringMatch{"@request.auth.claims.group": exact("a")}}},
				Route: routeTo("reviews"),
			}}},
			wantHTTP: map[int]string{0: "only supported for gateway"},
		},
		{
			name: "timeout under a millisecond",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"), Timeout: &durationpb.Duration{Nanos: 1000},
			}}},
			wantHTTP: map[int]string{0: "duration must be greater than 1ms"},
		},
		{
			name: "fault percentage over 100",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"),
				Fault: &networkingapi.HTTPFaultInjection{Abort: &networkingapi.HTTPFaultInjection_Abort{
					Percentage: &networkingapi.Percent{Value: 120}, ErrorType: &networkingapi.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: 503},
				}},
			}}},
			wantHTTP: map[int]string{0: "percentage 120 is neither 0.0"},
		},
		{
			name: "abort status Envoy refuses",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"),
				Fault: &networkingapi.HTTPFaultInjection{Abort: &networkingapi.HTTPFaultInjection_Abort{
					ErrorType: &networkingapi.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: 600},
				}},
			}}},
			wantHTTP: map[int]string{0: "HTTP status 600 is not in range 200-599"},
		},
		{
			name: "weights all zero",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: []*networkingapi.HTTPRouteDestination{
					{Destination: &networkingapi.Destination{Host: "a"}}, {Destination: &networkingapi.Destination{Host: "b"}},
				},
			}}},
			wantHTTP: map[int]string{0: "total destination weight = 0"},
		},
		{
			name: "weights beyond a uint32",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: []*networkingapi.HTTPRouteDestination{
					{Destination: &networkingapi.Destination{Host: "a"}, Weight: 2000000000},
					{Destination: &networkingapi.Destination{Host: "b"}, Weight: 2000000000},
					{Destination: &networkingapi.Destination{Host: "c"}, Weight: 2000000000},
				},
			}}},
			wantHTTP: map[int]string{0: "larger than 4294967295"},
		},
		{
			name: "port and subset",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{
					Host: "reviews", Subset: "v_1", Port: &networkingapi.PortSelector{Number: 70000},
				}}},
			}}},
			wantHTTP: map[int]string{0: "subset name is invalid: v_1"},
		},
		{
			name: "rewrite with a newline",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"), Rewrite: &networkingapi.HTTPRewrite{Uri: "/a\r\nx-evil: 1"},
			}}},
			wantHTTP: map[int]string{0: "may not contain NUL, CR or LF"},
		},
		{
			name: "unknown retryOn",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"), Retries: &networkingapi.HTTPRetry{Attempts: 2, RetryOn: "5xx,sometimes"},
			}}},
			wantHTTP: map[int]string{0: `"sometimes" is not a valid retryOn policy`},
		},
		{
			name: "redirect and route",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, Http: []*networkingapi.HTTPRoute{{
				Route: routeTo("reviews"), Redirect: &networkingapi.HTTPRedirect{Uri: "/x"},
			}}},
			wantHTTP: map[int]string{0: "cannot contain both route and redirect"},
		},
		{
			name: "exportTo",
			vs: &networkingapi.VirtualService{Hosts: []string{"reviews"}, ExportTo: []string{"*", "."},
				Http: []*networkingapi.HTTPRoute{good()}},
			wantSpec: "cannot have both public (*) and non-public",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := CheckVirtualService("default", tt.vs)
			wantErr(t, got.Spec, tt.wantSpec)
			for i := range tt.vs.GetHttp() {
				wantErr(t, got.HTTP[i], tt.wantHTTP[i])
			}
			wantErr(t, VirtualService("default", tt.vs), tt.wantSpec+firstOf(tt.wantHTTP))
		})
	}
}

func firstOf(m map[int]string) string {
	for _, i := range sortedInts(m) {
		return m[i]
	}
	return ""
}

func TestDestinationRule(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		dr   *networkingapi.DestinationRule
		want string
	}{
		{name: "good", dr: &networkingapi.DestinationRule{Host: "reviews", Subsets: []*networkingapi.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}}}},
		{name: "bad host", dr: &networkingapi.DestinationRule{Host: "re*views"}, want: `label "re*views" invalid`},
		{name: "duplicate subsets", dr: &networkingapi.DestinationRule{Host: "reviews", Subsets: []*networkingapi.Subset{{Name: "v1"}, {Name: "v1"}}}, want: "duplicate subset names: v1"},
		{name: "connect timeout 0", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			ConnectionPool: &networkingapi.ConnectionPoolSettings{Tcp: &networkingapi.ConnectionPoolSettings_TCPSettings{ConnectTimeout: durationpb.New(0)}},
		}}, want: "greater than 1ms"},
		{name: "ejection percent", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			OutlierDetection: &networkingapi.OutlierDetection{MaxEjectionPercent: 150},
		}}, want: "percentage 150 is not in range 0..100"},
		{name: "cookie without a name", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{
				HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpCookie{HttpCookie: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HTTPCookie{}},
			}}},
		}}, want: "name required for HttpCookie"},
		{name: "hash header Envoy refuses", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{
				HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName{HttpHeaderName: ""},
			}}},
		}}, want: "is not a valid header name"},
		{name: "ring too large", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{
				HashAlgorithm: &networkingapi.LoadBalancerSettings_ConsistentHashLB_RingHash_{RingHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB_RingHash{MinimumRingSize: 1 << 30}},
			}}},
		}}, want: "minimumRingSize 1073741824 is larger than 8388608"},
		{name: "mutual without a key", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			Tls: &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_MUTUAL, ClientCertificate: "/c.pem"},
		}}, want: "private key required for mutual tls"},
		{name: "long SNI", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{
			Tls: &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_SIMPLE, Sni: strings.Repeat("a", 256)},
		}}, want: "longer than 255 bytes"},
		{name: "empty traffic policy", dr: &networkingapi.DestinationRule{Host: "reviews", TrafficPolicy: &networkingapi.TrafficPolicy{}},
			want: "traffic policy must have at least one field"},
		{name: "selector beyond its namespace", dr: &networkingapi.DestinationRule{Host: "reviews", ExportTo: []string{"*"},
			WorkloadSelector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}}},
			want: "cannot have exportTo beyond current namespace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, DestinationRule("default", tt.dr), tt.want)
		})
	}
}

func TestServiceEntry(t *testing.T) {
	t.Parallel()
	port := []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	for _, tt := range []struct {
		name string
		se   *networkingapi.ServiceEntry
		want string
	}{
		{name: "good", se: &networkingapi.ServiceEntry{Hosts: []string{"api.example.com"}, Ports: port, Resolution: networkingapi.ServiceEntry_DNS}},
		{name: "wildcard inside", se: &networkingapi.ServiceEntry{Hosts: []string{"a*b.example.com"}, Ports: port}, want: `label "a*b" invalid`},
		{name: "star", se: &networkingapi.ServiceEntry{Hosts: []string{"*"}, Ports: port}, want: "invalid host *"},
		{name: "bad port", se: &networkingapi.ServiceEntry{Hosts: []string{"a.example.com"}, Ports: []*networkingapi.ServicePort{{Number: 0, Name: "x"}}}, want: "port number 0"},
		{name: "bad protocol", se: &networkingapi.ServiceEntry{Hosts: []string{"a.example.com"}, Ports: []*networkingapi.ServicePort{{Number: 80, Name: "x", Protocol: "SPDY"}}}, want: "unsupported protocol: SPDY"},
		{name: "static FQDN endpoint", se: &networkingapi.ServiceEntry{Hosts: []string{"a.example.com"}, Ports: port, Resolution: networkingapi.ServiceEntry_STATIC,
			Endpoints: []*networkingapi.WorkloadEntry{{Address: "db.example.com"}}}, want: "is not a valid IP address"},
		{name: "CIDR with DNS", se: &networkingapi.ServiceEntry{Hosts: []string{"a.example.com"}, Ports: port, Resolution: networkingapi.ServiceEntry_DNS,
			Addresses: []string{"10.0.0.0/8"}}, want: "CIDR addresses are allowed only for NONE/STATIC"},
		{name: "no one and someone", se: &networkingapi.ServiceEntry{Hosts: []string{"a.example.com"}, Ports: port, ExportTo: []string{"~", "."}},
			want: "cannot export service entry to no one"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, ServiceEntry("default", tt.se), tt.want)
		})
	}
}

func TestSidecar(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		sc   *networkingapi.Sidecar
		want string
	}{
		{name: "good", sc: &networkingapi.Sidecar{Egress: []*networkingapi.IstioEgressListener{{Hosts: []string{"./*", "istio-system/*"}}}}},
		{name: "empty", sc: &networkingapi.Sidecar{}, want: "empty configuration provided"},
		{name: "short name", sc: &networkingapi.Sidecar{Egress: []*networkingapi.IstioEgressListener{{Hosts: []string{"./reviews"}}}}, want: "short names (non FQDN)"},
		{name: "no namespace", sc: &networkingapi.Sidecar{Egress: []*networkingapi.IstioEgressListener{{Hosts: []string{"reviews.default.svc"}}}}, want: "host must be of form namespace/dnsName"},
		{name: "partial wildcard", sc: &networkingapi.Sidecar{Egress: []*networkingapi.IstioEgressListener{{Hosts: []string{"*/*foo.com"}}}}, want: `partial wildcard "*foo.com" not allowed`},
		{name: "catch-all not last", sc: &networkingapi.Sidecar{Egress: []*networkingapi.IstioEgressListener{
			{Hosts: []string{"*/*"}}, {Port: &networkingapi.SidecarPort{Number: 80, Protocol: "HTTP", Name: "http"}, Hosts: []string{"*/*"}},
		}}, want: "should be the last listener"},
		{name: "selector wildcard", sc: &networkingapi.Sidecar{WorkloadSelector: &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "*"}},
			Egress: []*networkingapi.IstioEgressListener{{Hosts: []string{"*/*"}}}}, want: "wildcard is not supported in selector"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, Sidecar("default", tt.sc), tt.want)
		})
	}
}

func TestAuthorizationPolicy(t *testing.T) {
	t.Parallel()
	from := func(s *securityapi.Source) []*securityapi.Rule {
		return []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: s}}}}
	}
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		ap          *securityapi.AuthorizationPolicy
		want        string
	}{
		{name: "good", ap: &securityapi.AuthorizationPolicy{Rules: from(&securityapi.Source{Namespaces: []string{"a"}})}},
		{name: "allow nothing", ap: &securityapi.AuthorizationPolicy{}},
		{name: "deny without rules", ap: &securityapi.AuthorizationPolicy{Action: securityapi.AuthorizationPolicy_DENY},
			want: "invalid policy p.default: DENY action without `rules` is meaningless"},
		{name: "bad CIDR", ap: &securityapi.AuthorizationPolicy{Rules: from(&securityapi.Source{IpBlocks: []string{"10.0.0.0/33"}})},
			want: "bad CIDR range (10.0.0.0/33)"},
		{name: "empty source", ap: &securityapi.AuthorizationPolicy{Rules: from(&securityapi.Source{})},
			want: "`from.source` must not be empty, found at rule 0"},
		{name: "bad port", ap: &securityapi.AuthorizationPolicy{Rules: []*securityapi.Rule{{To: []*securityapi.Rule_To{{
			Operation: &securityapi.Operation{Ports: []string{"70000"}}}}}}}, want: "bad port (70000)"},
		{name: "bad path template", ap: &securityapi.AuthorizationPolicy{Rules: []*securityapi.Rule{{To: []*securityapi.Rule_To{{
			Operation: &securityapi.Operation{Paths: []string{"/{**}/a/{**}"}}}}}}}, want: "{**} is not the last operator"},
		{name: "unknown attribute", ap: &securityapi.AuthorizationPolicy{Rules: []*securityapi.Rule{{When: []*securityapi.Condition{{
			Key: "source.color", Values: []string{"red"}}}}}}, want: "unknown attribute: source.color"},
		{name: "bad header key", ap: &securityapi.AuthorizationPolicy{Rules: []*securityapi.Rule{{When: []*securityapi.Condition{{
			Key: "request.headers", Values: []string{"a"}}}}}}, want: "should have format a[b]"},
		{name: "dry-run value", annotations: map[string]string{AnnotationDryRun: "maybe"},
			ap: &securityapi.AuthorizationPolicy{}, want: "has annotation istio.io/dry-run with invalid value (maybe)"},
		{name: "dry-run custom", annotations: map[string]string{AnnotationDryRun: "true"},
			ap: &securityapi.AuthorizationPolicy{Action: securityapi.AuthorizationPolicy_CUSTOM, Rules: []*securityapi.Rule{{}},
				ActionDetail: &securityapi.AuthorizationPolicy_Provider{Provider: &securityapi.AuthorizationPolicy_ExtensionProvider{Name: "ext"}}},
			want: "only supports action ALLOW/DENY"},
		{name: "custom without provider", ap: &securityapi.AuthorizationPolicy{Action: securityapi.AuthorizationPolicy_CUSTOM, Rules: []*securityapi.Rule{{}}},
			want: "`provider.name` must not be empty"},
		{name: "selector and targetRef", ap: &securityapi.AuthorizationPolicy{
			Selector:  &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}},
			TargetRef: &typeapi.PolicyTargetReference{Kind: "Service", Name: "a"}},
			want: "only one of targetRefs or workloadSelector can be set"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErr(t, AuthorizationPolicy("default", "p", tt.annotations, tt.ap), tt.want)
		})
	}
}

func TestPeerAuthenticationAndAnnotations(t *testing.T) {
	t.Parallel()
	wantErr(t, PeerAuthentication(&securityapi.PeerAuthentication{
		PortLevelMtls: map[uint32]*securityapi.PeerAuthentication_MutualTLS{8080: {Mode: securityapi.PeerAuthentication_MutualTLS_DISABLE}},
	}), "cannot have port level mTLS")
	wantErr(t, PeerAuthentication(&securityapi.PeerAuthentication{
		Selector:      &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}},
		PortLevelMtls: map[uint32]*securityapi.PeerAuthentication_MutualTLS{0: {}},
	}), "port must be in range 1..65535")
	wantErr(t, PeerAuthentication(&securityapi.PeerAuthentication{Mtls: &securityapi.PeerAuthentication_MutualTLS{Mode: securityapi.PeerAuthentication_MutualTLS_STRICT}}), "")

	wantErr(t, Annotations("VirtualService", "default", "r", map[string]string{AnnotationDryRun: "true"}), "unsupported annotation istio.io/dry-run")
	wantErr(t, Annotations("AuthorizationPolicy", "default", "r", map[string]string{AnnotationDryRun: "true"}), "")
	wantErr(t, Annotations("Gateway", "istio-system", "probe", map[string]string{AnnotationAlwaysReject: "true"}), "annotation found, rejecting")
	wantErr(t, Annotations("VirtualService", "default", "r", map[string]string{"internal.istio.io/parents": "x"}), "may not be set by users")
}

func TestErrorFormat(t *testing.T) {
	t.Parallel()
	err := VirtualService("default", &networkingapi.VirtualService{Hosts: []string{"a*b.example.com"}, Http: []*networkingapi.HTTPRoute{{
		Match: []*networkingapi.HTTPMatchRequest{{Uri: regexURI("(")}}, Route: routeTo("reviews"), Timeout: durationpb.New(0),
	}}})
	want := "3 errors occurred:\n" +
		"\t* domain name \"a*b.example.com\" invalid (label \"a*b\" invalid)\n" +
		"\t* \"uri\": error parsing regexp: missing closing ): `(`; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)\n" +
		"\t* duration must be greater than 1ms\n\n"
	if err == nil || err.Error() != want {
		t.Errorf("VirtualService() error =\n%q\nwant\n%q", err, want)
	}
	if got, want := Summary(err), "domain name \"a*b.example.com\" invalid (label \"a*b\" invalid); \"uri\": error parsing regexp: missing closing ): `(`; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax); duration must be greater than 1ms"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
}
