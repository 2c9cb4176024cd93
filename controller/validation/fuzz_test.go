package validation

import (
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
)

// FuzzRegex: what Regex accepts compiles, within Envoy's limits.
func FuzzRegex(f *testing.F) {
	for _, s := range []string{"(", "^/api/.*$", "a{1000}", "(a|b)*c", `\pL+`, "[[:alpha:]]", "(?i)x", "*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, re string) {
		if Regex(re, "uri") != nil {
			return
		}
		if _, err := regexp.Compile(re); err != nil {
			t.Fatalf("Regex(%q) accepted what does not compile: %v", re, err)
		}
		if len(re) == 0 || len(re) > MaxRegexLength || programSize(re) > MaxRegexProgramSize {
			t.Fatalf("Regex(%q) accepted an expression beyond Envoy's limits", re)
		}
	})
}

// FuzzHost: what Host accepts has a wildcard only as (the start of) its
// leftmost label, and only the characters of a DNS name.
func FuzzHost(f *testing.F) {
	for _, s := range []string{"a*b.example.com", "*.example.com", "*", "foo.*.com", "reviews", "*-x.y", "a.b.", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if Host(host) != nil {
			return
		}
		if len(host) == 0 || len(host) > 255 {
			t.Fatalf("Host(%q) accepted a name of %d bytes", host, len(host))
		}
		if strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-*") != "" {
			t.Fatalf("Host(%q) accepted a character outside a DNS name", host)
		}
		if i := strings.LastIndexByte(host, '*'); i >= 0 && (i > 0 || strings.Count(host, "*") > 1) {
			t.Fatalf("Host(%q) accepted a wildcard outside the start of its first label", host)
		}
	})
}

// FuzzObjects: no input makes a check panic, whatever the API server
// hands the webhook.
func FuzzObjects(f *testing.F) {
	for _, s := range []string{
		`{"hosts":["r"],"http":[{"match":[{"uri":{"regex":"("}}],"route":[{"destination":{"host":"r"}}]}]}`,
		`{"host":"r","trafficPolicy":{"portLevelSettings":[{}]},"subsets":[{"name":"v1","trafficPolicy":{"loadBalancer":{"consistentHash":{"maglev":{"tableSize":4}}}}}]}`,
		`{"hosts":["a.com"],"ports":[{"number":80,"name":"h"}],"resolution":"STATIC","endpoints":[{"address":"unix://"}]}`,
		`{"egress":[{"hosts":["~/*"]},{}]}`,
		`{"action":"CUSTOM","rules":[{"from":[{}],"to":[{"operation":{"paths":["/{**}/{*}"]}}],"when":[{"key":"request.headers[a]"}]}]}`,
		`{"portLevelMtls":{"0":{}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		opts := protojson.UnmarshalOptions{DiscardUnknown: true}
		var vs networkingapi.VirtualService
		if opts.Unmarshal(b, &vs) == nil {
			_ = VirtualService("ns", &vs)
		}
		var dr networkingapi.DestinationRule
		if opts.Unmarshal(b, &dr) == nil {
			_ = DestinationRule("ns", &dr)
		}
		var se networkingapi.ServiceEntry
		if opts.Unmarshal(b, &se) == nil {
			_ = ServiceEntry("ns", &se)
		}
		var sc networkingapi.Sidecar
		if opts.Unmarshal(b, &sc) == nil {
			_ = Sidecar("ns", &sc)
		}
		var ap securityapi.AuthorizationPolicy
		if opts.Unmarshal(b, &ap) == nil {
			_ = AuthorizationPolicy("ns", "p", nil, &ap)
		}
		var pa securityapi.PeerAuthentication
		if opts.Unmarshal(b, &pa) == nil {
			_ = PeerAuthentication(&pa)
		}
	})
}
