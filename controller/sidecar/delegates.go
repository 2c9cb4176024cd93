package sidecar

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// mergeDelegates replaces each HTTP route of a root VirtualService that
// delegates (http[].delegate) with the delegate's routes, as istiod merges
// them: each delegate route's matches are narrowed by the root route's
// (a delegate route none of whose matches fits inside a root match is
// dropped), and what the delegate route leaves unset it takes from the
// root route. A delegate that does not exist, has hosts of its own, or is
// not exported to the root's namespace contributes nothing: the requests
// it would have routed match no route. A delegate's short destination
// hosts name services of its own namespace.
func mergeDelegates(vss []*networkingv1.VirtualService, domain string) []*networkingv1.VirtualService {
	delegates := map[string]*networkingv1.VirtualService{}
	for _, vs := range vss {
		if len(vs.Spec.GetHosts()) == 0 {
			delegates[vs.Namespace+"/"+vs.Name] = vs
		}
	}
	out := make([]*networkingv1.VirtualService, 0, len(vss))
	for _, vs := range vss {
		if len(vs.Spec.GetHosts()) == 0 || !slices.ContainsFunc(vs.Spec.GetHttp(), func(hr *networkingapi.HTTPRoute) bool { return hr.GetDelegate() != nil }) {
			out = append(out, vs)
			continue
		}
		root := vs.DeepCopy()
		root.Spec.Http = nil
		for _, hr := range vs.Spec.GetHttp() {
			d := hr.GetDelegate()
			if d == nil {
				root.Spec.Http = append(root.Spec.Http, hr)
				continue
			}
			delegate := delegates[cmp.Or(d.GetNamespace(), vs.Namespace)+"/"+d.GetName()]
			if delegate == nil || !exported(delegate.Spec.GetExportTo(), delegate.Namespace, vs.Namespace) {
				continue
			}
			for _, sub := range delegate.Spec.GetHttp() {
				if merged := mergeHTTPRoute(hr, resolveHosts(sub, delegate.Namespace, domain)); merged != nil {
					root.Spec.Http = append(root.Spec.Http, merged)
				}
			}
		}
		out = append(out, root)
	}
	return out
}

// resolveHosts is a copy of a delegate's route with its destination and
// mirror hosts made fully qualified in the delegate's namespace.
func resolveHosts(hr *networkingapi.HTTPRoute, ns, domain string) *networkingapi.HTTPRoute {
	out := proto.Clone(hr).(*networkingapi.HTTPRoute)
	for _, d := range out.GetRoute() {
		if d.GetDestination() != nil {
			d.Destination.Host = fqdn(d.GetDestination().GetHost(), ns, domain)
		}
	}
	if out.GetMirror() != nil {
		out.Mirror.Host = fqdn(out.GetMirror().GetHost(), ns, domain)
	}
	for _, m := range out.GetMirrors() {
		if m.GetDestination() != nil {
			m.Destination.Host = fqdn(m.GetDestination().GetHost(), ns, domain)
		}
	}
	return out
}

// mergeHTTPRoute narrows delegate route sub (a copy it may change) by root
// route root; nil when no match of sub fits a match of root.
func mergeHTTPRoute(root, sub *networkingapi.HTTPRoute) *networkingapi.HTTPRoute {
	matches, ok := mergeMatches(root.GetMatch(), sub.GetMatch())
	if !ok {
		return nil
	}
	sub.Match = matches
	switch {
	case sub.Name == "":
		sub.Name = root.GetName()
	case root.GetName() != "":
		sub.Name = root.GetName() + "-" + sub.Name
	}
	if sub.Rewrite == nil {
		sub.Rewrite = root.GetRewrite()
	}
	if sub.DirectResponse == nil {
		sub.DirectResponse = root.GetDirectResponse()
	}
	if sub.Timeout == nil {
		sub.Timeout = root.GetTimeout()
	}
	if sub.Retries == nil {
		sub.Retries = root.GetRetries()
	}
	if sub.Fault == nil {
		sub.Fault = root.GetFault()
	}
	if sub.Mirror == nil {
		sub.Mirror = root.GetMirror()
	}
	//lint:ignore SA1019 the older field is merged as istiod merges it
	if sub.MirrorPercent == nil {
		//lint:ignore SA1019 as above
		sub.MirrorPercent = root.GetMirrorPercent()
	}
	if sub.MirrorPercentage == nil {
		sub.MirrorPercentage = root.GetMirrorPercentage()
	}
	if sub.CorsPolicy == nil {
		sub.CorsPolicy = root.GetCorsPolicy()
	}
	if sub.Mirrors == nil {
		sub.Mirrors = root.GetMirrors()
	}
	if sub.Headers == nil {
		sub.Headers = root.GetHeaders()
	}
	return sub
}

// mergeMatches narrows each delegate match by every root match it does not
// conflict with; ok is false when a delegate match fits none.
func mergeMatches(root, sub []*networkingapi.HTTPMatchRequest) (_ []*networkingapi.HTTPMatchRequest, ok bool) {
	if len(root) == 0 {
		return sub, true
	}
	if len(sub) == 0 {
		return root, true
	}
	var out []*networkingapi.HTTPMatchRequest
	for _, s := range sub {
		found := false
		for _, r := range root {
			if matchesConflict(r, s) {
				continue
			}
			out = append(out, mergeMatch(r, s))
			found = true
		}
		if !found {
			return nil, false
		}
	}
	return out, len(out) > 0
}

// mergeMatch is delegate match s with what it leaves unset taken from
// root match r (maps joined, s's entries winning).
func mergeMatch(r, s *networkingapi.HTTPMatchRequest) *networkingapi.HTTPMatchRequest {
	out := proto.Clone(s).(*networkingapi.HTTPMatchRequest)
	switch {
	case out.Name == "":
		out.Name = r.GetName()
	case r.GetName() != "":
		out.Name = r.GetName() + "-" + out.Name
	}
	if out.Uri == nil {
		out.Uri = r.GetUri()
	}
	if out.Scheme == nil {
		out.Scheme = r.GetScheme()
	}
	if out.Method == nil {
		out.Method = r.GetMethod()
	}
	if out.Authority == nil {
		out.Authority = r.GetAuthority()
	}
	out.Headers = joined(r.GetHeaders(), s.GetHeaders())
	out.WithoutHeaders = joined(r.GetWithoutHeaders(), s.GetWithoutHeaders())
	out.QueryParams = joined(r.GetQueryParams(), s.GetQueryParams())
	if out.Port == 0 {
		out.Port = r.GetPort()
	}
	out.SourceLabels = joined(r.GetSourceLabels(), s.GetSourceLabels())
	if out.SourceNamespace == "" {
		out.SourceNamespace = r.GetSourceNamespace()
	}
	if len(out.Gateways) == 0 {
		out.Gateways = r.GetGateways()
	}
	if out.StatPrefix == "" {
		out.StatPrefix = r.GetStatPrefix()
	}
	return out
}

func joined[V any](a, b map[string]V) map[string]V {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	out := maps.Clone(a)
	if out == nil {
		out = map[string]V{}
	}
	maps.Copy(out, b)
	return out
}

// matchesConflict reports a delegate match that asks for what root match r
// excludes: a path, scheme, method, authority, header or query parameter
// outside r's, another case rule, port, source namespace, source label
// value, or gateway.
func matchesConflict(r, s *networkingapi.HTTPMatchRequest) bool {
	pairs := [][2]*networkingapi.StringMatch{{r.GetUri(), s.GetUri()}, {r.GetScheme(), s.GetScheme()}, {r.GetMethod(), s.GetMethod()}, {r.GetAuthority(), s.GetAuthority()}}
	for k, v := range s.GetHeaders() {
		pairs = append(pairs, [2]*networkingapi.StringMatch{r.GetHeaders()[k], v})
	}
	for k, v := range s.GetWithoutHeaders() {
		pairs = append(pairs, [2]*networkingapi.StringMatch{r.GetWithoutHeaders()[k], v})
	}
	for k, v := range s.GetQueryParams() {
		pairs = append(pairs, [2]*networkingapi.StringMatch{r.GetQueryParams()[k], v})
	}
	for _, p := range pairs {
		if stringMatchConflict(p[0], p[1]) {
			return true
		}
	}
	if r.GetIgnoreUriCase() != s.GetIgnoreUriCase() {
		return true
	}
	if r.GetPort() > 0 && s.GetPort() > 0 && r.GetPort() != s.GetPort() {
		return true
	}
	if r.GetSourceNamespace() != "" && s.GetSourceNamespace() != r.GetSourceNamespace() {
		return true
	}
	for k, v := range s.GetSourceLabels() {
		if rv, ok := r.GetSourceLabels()[k]; ok && rv != v {
			return true
		}
	}
	if len(r.GetGateways()) > 0 && len(s.GetGateways()) > 0 {
		if len(r.GetGateways()) < len(s.GetGateways()) {
			return true
		}
		for _, g := range s.GetGateways() {
			if !slices.Contains(r.GetGateways(), g) {
				return true
			}
		}
	}
	return false
}

// stringMatchConflict reports a delegate string match that is not inside
// the root's: only exact and prefix matches inside a root prefix, or the
// same exact value, fit; a regex fits nothing but an unset match.
func stringMatchConflict(r, s *networkingapi.StringMatch) bool {
	if r == nil || s == nil {
		return false
	}
	if r.GetRegex() != "" && (s.GetRegex() != "" || s.GetPrefix() != "" || s.GetExact() != "") {
		return true
	}
	if s.GetRegex() != "" && (r.GetRegex() != "" || r.GetPrefix() != "" || r.GetExact() != "") {
		return true
	}
	if exact := r.GetExact(); exact != "" {
		return s.GetPrefix() != "" || s.GetExact() != exact
	}
	if prefix := r.GetPrefix(); prefix != "" {
		switch {
		case s.GetPrefix() != "":
			return !strings.HasPrefix(s.GetPrefix(), prefix)
		case s.GetExact() != "":
			return !strings.HasPrefix(s.GetExact(), prefix)
		}
	}
	return true
}
