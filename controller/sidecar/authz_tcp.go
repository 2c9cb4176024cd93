package sidecar

import (
	"strings"

	"google.golang.org/protobuf/proto"
	securityapi "istio.io/api/security/v1beta1"
)

// usesHTTP reports a rule that needs what only an HTTP request carries,
// which a TCP chain cannot see (envoyRuleSets).
func usesHTTP(r *securityapi.Rule) bool {
	return !proto.Equal(r, withoutHTTP(r))
}

// withoutHTTP is r without what only an HTTP request carries: request
// principals, hosts, methods and paths, and conditions on request.*
// attributes.
func withoutHTTP(r *securityapi.Rule) *securityapi.Rule {
	out := proto.Clone(r).(*securityapi.Rule)
	for _, f := range out.GetFrom() {
		if s := f.GetSource(); s != nil {
			s.RequestPrincipals, s.NotRequestPrincipals = nil, nil
		}
	}
	for _, t := range out.GetTo() {
		if o := t.GetOperation(); o != nil {
			o.Hosts, o.NotHosts, o.Methods, o.NotMethods, o.Paths, o.NotPaths = nil, nil, nil, nil, nil, nil
		}
	}
	var when []*securityapi.Condition
	for _, c := range out.GetWhen() {
		if !strings.HasPrefix(c.GetKey(), "request.") {
			when = append(when, c)
		}
	}
	out.When = when
	return out
}
