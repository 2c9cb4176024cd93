package sidecar

import (
	"strings"

	"google.golang.org/protobuf/proto"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
)

// tcpPolicies are policies as they apply to plain TCP, where nothing of
// HTTP can be seen (Istio's rule): a DENY rule loses its HTTP-only
// fields and conditions, so it denies at least what it denies over HTTP;
// an ALLOW rule with any of them is dropped, so it allows nothing it
// would not allow over HTTP (an ALLOW policy left without rules allows
// nothing). Without this an HTTP matcher, which never matches on a TCP
// connection, would make a DENY rule deny nothing.
func tcpPolicies(deny bool, policies []*securityv1.AuthorizationPolicy) []*securityv1.AuthorizationPolicy {
	out := make([]*securityv1.AuthorizationPolicy, 0, len(policies))
	for _, ap := range policies {
		c := &securityv1.AuthorizationPolicy{ObjectMeta: ap.ObjectMeta}
		c.Spec.Action = ap.Spec.GetAction()
		for _, r := range ap.Spec.GetRules() {
			if !usesHTTP(r) {
				c.Spec.Rules = append(c.Spec.Rules, r)
				continue
			}
			if deny {
				c.Spec.Rules = append(c.Spec.Rules, withoutHTTP(r))
			}
		}
		if len(ap.Spec.GetRules()) > 0 && len(c.Spec.Rules) == 0 && deny {
			continue
		}
		out = append(out, c)
	}
	return out
}

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
