package sidecar

import (
	"cmp"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonfaultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// defaultRetryOn is the retry policy of a route no VirtualService sets
// one for (sidecar wire contract §5).
const defaultRetryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"

// noTimeout is an explicit 0s: no timeout.
var noTimeout = durationpb.New(0)

// defaultRetry is the retry policy of a route that sets none. A route to
// one consistently hashed destination does not avoid the hosts it tried
// before: the hash picks the same host again on purpose.
func defaultRetry(hashed bool) *routev3.RetryPolicy {
	p := &routev3.RetryPolicy{
		RetryOn:                       defaultRetryOn,
		NumRetries:                    wrapperspb.UInt32(2),
		HostSelectionRetryMaxAttempts: 5,
	}
	if !hashed {
		p.RetryHostPredicate = []*routev3.RetryPolicy_RetryHostPredicate{{
			Name:       "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: mustAny(&previoushostsv3.PreviousHostsPredicate{})},
		}}
	}
	return p
}

// routeTarget is the service and port a route configuration serves.
type routeTarget struct {
	svc  *Service
	port uint32
}

// defaultRoute sends everything to the service's port cluster, hashed as
// the service's DestinationRule says. Its "no timeout" is the one a
// VirtualService-less route of Istio's sidecars carries, max_grpc_timeout
// 0s, which a proxyless client ignores as it ignores any 0s timeout.
func (m *Mesh) defaultRoute(p Proxy, t routeTarget) *routev3.Route {
	host := t.svc.GetHostname()
	action := &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(Outbound, t.port, "", host)},
		RetryPolicy:      defaultRetry(false),
		Timeout:          noTimeout,
		//lint:ignore SA1019 the field Istio's default route sets
		MaxGrpcTimeout: noTimeout,
	}
	if hp := hashPolicy(m.destinationHash(p, host, t.port, "")); hp != nil {
		action.HashPolicy = []*routev3.RouteAction_HashPolicy{hp}
	}
	return &routev3.Route{
		Name:      "default",
		Match:     &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Decorator: &routev3.Decorator{Operation: host + ":" + u32(t.port) + "/*"},
		Action:    &routev3.Route_Route{Route: action},
	}
}

// routes returns the routes of target for proxy p: those of the first
// VirtualService for the host (oldest first, as Istio picks), else the
// default route. A VirtualService's routes are all there is: a request
// that matches none is not routed.
func (m *Mesh) routes(p Proxy, t routeTarget) []*routev3.Route {
	vss := m.VirtualServices(p, t.svc.GetHostname())
	if len(vss) == 0 {
		return []*routev3.Route{m.defaultRoute(p, t)}
	}
	vs := vss[0]
	var out []*routev3.Route
	for _, hr := range vs.Spec.GetHttp() {
		matches := hr.GetMatch()
		if len(matches) == 0 {
			matches = []*networkingapi.HTTPMatchRequest{nil}
		}
		for _, mr := range matches {
			if !matchApplies(mr, p, t.port) {
				continue
			}
			r := m.translateRoute(p, vs, hr, mr, t)
			out = append(out, r)
			if isCatchAll(mr) {
				// Nothing after a catch-all can match.
				return out
			}
		}
	}
	return out
}

// matchApplies reports whether a match's port, gateways, source labels and
// source namespace let it apply to proxy p's traffic to port.
func matchApplies(mr *networkingapi.HTTPMatchRequest, p Proxy, port uint32) bool {
	if mr == nil {
		return true
	}
	if mr.GetPort() != 0 && mr.GetPort() != port {
		return false
	}
	if len(mr.GetGateways()) > 0 && !slices.Contains(mr.GetGateways(), "mesh") {
		return false
	}
	for k, v := range mr.GetSourceLabels() {
		if got, ok := p.Labels[k]; !ok || got != v {
			return false
		}
	}
	if ns := mr.GetSourceNamespace(); ns != "" && ns != p.Namespace {
		return false
	}
	return true
}

// isCatchAll reports whether a match matches every request.
func isCatchAll(mr *networkingapi.HTTPMatchRequest) bool {
	if mr == nil {
		return true
	}
	uri := mr.GetUri()
	return (uri == nil || uri.GetPrefix() == "/") && len(mr.GetHeaders()) == 0 && len(mr.GetWithoutHeaders()) == 0 &&
		mr.GetMethod() == nil && mr.GetAuthority() == nil && mr.GetScheme() == nil && len(mr.GetQueryParams()) == 0
}

// translateRoute turns one HTTP route and one of its matches into a route,
// as istiod does: its header operations, then a redirect, a direct
// response or the destinations (with rewrites, mirrors, timeout and
// retries), then fault injection and CORS.
func (m *Mesh) translateRoute(p Proxy, vs *networkingv1.VirtualService, hr *networkingapi.HTTPRoute, mr *networkingapi.HTTPMatchRequest, t routeTarget) *routev3.Route {
	name := hr.GetName()
	if mr.GetName() != "" {
		name += "." + mr.GetName()
	}
	out := &routev3.Route{
		Name:       name,
		Match:      translateMatch(mr),
		Metadata:   configMetadata(vs),
		StatPrefix: mr.GetStatPrefix(),
	}
	ops := translateHeaders(hr.GetHeaders())
	out.RequestHeadersToAdd, out.RequestHeadersToRemove = ops.requestAdd, ops.requestRemove
	out.ResponseHeadersToAdd, out.ResponseHeadersToRemove = ops.responseAdd, ops.responseRemove
	switch {
	case hr.GetRedirect() != nil:
		if rd := translateRedirect(hr.GetRedirect(), t.port); rd != nil {
			out.Action = &routev3.Route_Redirect{Redirect: rd}
		}
	case hr.GetDirectResponse() != nil:
		out.Action = &routev3.Route_DirectResponse{DirectResponse: translateDirectResponse(hr.GetDirectResponse())}
	default:
		m.routeDestinations(p, vs, hr, out, ops.authority, t.port)
	}
	if c := out.GetRoute().GetCluster(); c != "" {
		if k, err := ParseClusterName(c); err == nil {
			out.Decorator = &routev3.Decorator{Operation: k.Hostname + ":" + u32(k.Port) + pathOf(out.Match)}
		}
	}
	if out.Decorator == nil {
		out.Decorator = &routev3.Decorator{Operation: vs.Name + ":" + u32(t.port) + pathOf(out.Match)}
	}
	if f := translateFault(hr.GetFault()); f != nil {
		out.TypedPerFilterConfig = map[string]*anypb.Any{"envoy.filters.http.fault": mustAny(f)}
	}
	if c := hr.GetCorsPolicy(); c != nil {
		if out.TypedPerFilterConfig == nil {
			out.TypedPerFilterConfig = map[string]*anypb.Any{}
		}
		out.TypedPerFilterConfig["envoy.filters.http.cors"] = mustAny(translateCORS(c))
	}
	return out
}

// routeDestinations sets a route's action to its destinations: one
// cluster (its header operations join the route's), or weighted clusters
// without those of weight 0 (each with its own header operations); with
// the rewrites, the authority (the rewrite's, else the headers'), mirrors,
// timeout, retries and the destinations' consistent hashes.
func (m *Mesh) routeDestinations(p Proxy, vs *networkingv1.VirtualService, hr *networkingapi.HTTPRoute, out *routev3.Route, authority string, port uint32) {
	action := &routev3.RouteAction{}
	m.setRouteTimeout(p, action, hr.GetTimeout())
	out.Action = &routev3.Route_Route{Route: action}
	if rw := hr.GetRewrite(); rw != nil {
		if re := rw.GetUriRegexRewrite(); re != nil {
			action.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: re.GetMatch()}, Substitution: re.GetRewrite()}
		} else if rw.GetUri() != "" {
			action.PrefixRewrite = rw.GetUri()
		}
		if rw.GetAuthority() != "" {
			authority = rw.GetAuthority()
		}
	}
	if authority != "" {
		action.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: authority}
	}
	if hr.GetMirror() != nil {
		if pct := mirrorPercent(hr); pct != nil {
			action.RequestMirrorPolicies = append(action.RequestMirrorPolicies, mirrorPolicy(m.destinationCluster(p, hr.GetMirror(), vs.Namespace, port), pct))
		}
	}
	for _, mp := range hr.GetMirrors() {
		if pct := mirrorPolicyPercent(mp); pct != nil && mp.GetDestination() != nil {
			action.RequestMirrorPolicies = append(action.RequestMirrorPolicies, mirrorPolicy(m.destinationCluster(p, mp.GetDestination(), vs.Namespace, port), pct))
		}
	}
	hash := func(d *networkingapi.Destination) *networkingapi.LoadBalancerSettings_ConsistentHashLB {
		// A port-level hash counts only for a destination naming its port.
		return m.destinationHash(p, fqdn(d.GetHost(), vs.Namespace, m.DomainSuffix), d.GetPort().GetNumber(), d.GetSubset())
	}
	hashed := false
	if routes := hr.GetRoute(); len(routes) == 1 {
		d := routes[0]
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: m.destinationCluster(p, d.GetDestination(), vs.Namespace, port)}
		if d.GetHeaders() != nil {
			ops := translateHeaders(d.GetHeaders())
			out.RequestHeadersToAdd = append(out.RequestHeadersToAdd, ops.requestAdd...)
			out.RequestHeadersToRemove = append(out.RequestHeadersToRemove, ops.requestRemove...)
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, ops.responseAdd...)
			out.ResponseHeadersToRemove = append(out.ResponseHeadersToRemove, ops.responseRemove...)
			// The route's own authority wins, so that one destination
			// and several behave alike.
			if ops.authority != "" && action.HostRewriteSpecifier == nil {
				action.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: ops.authority}
			}
		}
		h := hash(d.GetDestination())
		if hp := hashPolicy(h); hp != nil {
			action.HashPolicy = append(action.HashPolicy, hp)
		}
		// A consistent hash without a key still picks the same host
		// again: retries do not avoid it.
		hashed = h != nil
	} else {
		weighted := &routev3.WeightedCluster{}
		for _, d := range routes {
			if d.GetWeight() == 0 {
				continue // a zero weight takes no traffic
			}
			cw := &routev3.WeightedCluster_ClusterWeight{
				Name:   m.destinationCluster(p, d.GetDestination(), vs.Namespace, port),
				Weight: wrapperspb.UInt32(uint32(d.GetWeight())),
			}
			if d.GetHeaders() != nil {
				ops := translateHeaders(d.GetHeaders())
				cw.RequestHeadersToAdd, cw.RequestHeadersToRemove = ops.requestAdd, ops.requestRemove
				cw.ResponseHeadersToAdd, cw.ResponseHeadersToRemove = ops.responseAdd, ops.responseRemove
				if ops.authority != "" {
					cw.HostRewriteSpecifier = &routev3.WeightedCluster_ClusterWeight_HostRewriteLiteral{HostRewriteLiteral: ops.authority}
				}
			}
			weighted.Clusters = append(weighted.Clusters, cw)
			if hp := hashPolicy(hash(d.GetDestination())); hp != nil {
				action.HashPolicy = append(action.HashPolicy, hp)
			}
		}
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: weighted}
	}
	action.RetryPolicy = translateRetry(hr.GetRetries(), hashed)
}

// setRouteTimeout sets a route's timeout (none: 0s, no timeout). An Envoy
// sidecar also takes it as the longest a gRPC call's own timeout may ask
// for; a proxyless client reads it from max_stream_duration.
func (m *Mesh) setRouteTimeout(p Proxy, a *routev3.RouteAction, d *durationpb.Duration) {
	if d == nil {
		d = noTimeout
	}
	a.Timeout = d
	if p.HBONE {
		//lint:ignore SA1019 the field Istio's sidecars are configured by
		a.MaxGrpcTimeout = d
		return
	}
	a.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: d}
}

// headerOps are a Headers' operations as Envoy takes them, with the
// authority it sets (":authority" or "host", which Envoy cannot set as a
// header: the route rewrites the host instead).
type headerOps struct {
	requestAdd, responseAdd       []*corev3.HeaderValueOption
	requestRemove, responseRemove []string
	authority                     string
}

func translateHeaders(h *networkingapi.Headers) headerOps {
	if h == nil {
		return headerOps{}
	}
	req, resp := h.GetRequest(), h.GetResponse()
	setReq, setAuthority := headerValues(req.GetSet(), false)
	addReq, addAuthority := headerValues(req.GetAdd(), true)
	setResp, _ := headerValues(resp.GetSet(), false)
	addResp, _ := headerValues(resp.GetAdd(), true)
	return headerOps{
		requestAdd: append(setReq, addReq...), responseAdd: append(setResp, addResp...),
		requestRemove: settableHeaders(req.GetRemove()), responseRemove: settableHeaders(resp.GetRemove()),
		// "set" wins over "add".
		authority: cmp.Or(setAuthority, addAuthority),
	}
}

// headerValues are headers to set (or append to), sorted by name, with
// the authority among them.
func headerValues(headers map[string]string, appendValue bool) (_ []*corev3.HeaderValueOption, authority string) {
	var out []*corev3.HeaderValueOption
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		if strings.EqualFold(k, ":authority") || strings.EqualFold(k, "host") {
			authority = headers[k]
		}
		if internalHeader(k) {
			continue
		}
		action := corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		if appendValue {
			action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: headers[k]}, AppendAction: action})
	}
	return out, authority
}

// internalHeader: a pseudo-header or host, which Envoy cannot set.
func internalHeader(k string) bool { return strings.HasPrefix(k, ":") || strings.EqualFold(k, "host") }

func settableHeaders(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !internalHeader(k) {
			out = append(out, k)
		}
	}
	return out
}

// mirrorPercent is the share of a route's requests its mirror gets: all
// unless set; nil (no mirroring) when set to 0.
func mirrorPercent(hr *networkingapi.HTTPRoute) *corev3.RuntimeFractionalPercent {
	//lint:ignore SA1019 the older field, which rules still set
	old := hr.GetMirrorPercent()
	switch {
	case hr.GetMirrorPercentage() != nil:
		if hr.GetMirrorPercentage().GetValue() <= 0 {
			return nil
		}
		return &corev3.RuntimeFractionalPercent{DefaultValue: percentage(hr.GetMirrorPercentage(), 0)}
	case old != nil:
		if old.GetValue() == 0 {
			return nil
		}
		return &corev3.RuntimeFractionalPercent{DefaultValue: percentage(nil, int32(old.GetValue()))}
	}
	return &corev3.RuntimeFractionalPercent{DefaultValue: percentage(nil, 100)}
}

// mirrorPolicyPercent is mirrorPercent for one of a route's mirrors.
func mirrorPolicyPercent(mp *networkingapi.HTTPMirrorPolicy) *corev3.RuntimeFractionalPercent {
	if p := mp.GetPercentage(); p != nil {
		if p.GetValue() <= 0 {
			return nil
		}
		return &corev3.RuntimeFractionalPercent{DefaultValue: percentage(p, 0)}
	}
	return &corev3.RuntimeFractionalPercent{DefaultValue: percentage(nil, 100)}
}

// mirrorPolicy copies a share of the requests to cluster, without
// sampling the copies' traces, with the request's own host (no "-shadow"
// suffix, which would miss the mirror's virtual host).
func mirrorPolicy(cluster string, pct *corev3.RuntimeFractionalPercent) *routev3.RouteAction_RequestMirrorPolicy {
	return &routev3.RouteAction_RequestMirrorPolicy{Cluster: cluster, RuntimeFraction: pct, TraceSampled: wrapperspb.Bool(false), DisableShadowHostSuffixAppend: true}
}

// translateCORS is a CORS policy as Envoy's CORS filter takes it per
// route: origins as string matches, lists joined by commas, preflights
// that match no origin passed on unless the policy ignores them.
func translateCORS(in *networkingapi.CorsPolicy) *corsv3.CorsPolicy {
	out := &corsv3.CorsPolicy{
		ForwardNotMatchingPreflights: wrapperspb.Bool(in.GetUnmatchedPreflights() != networkingapi.CorsPolicy_IGNORE),
		FilterEnabled:                &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED}},
		AllowCredentials:             in.GetAllowCredentials(),
		AllowHeaders:                 strings.Join(in.GetAllowHeaders(), ","),
		AllowMethods:                 strings.Join(in.GetAllowMethods(), ","),
		ExposeHeaders:                strings.Join(in.GetExposeHeaders(), ","),
	}
	//lint:ignore SA1019 the older field, which policies still set
	old := in.GetAllowOrigin()
	switch {
	case in.GetAllowOrigins() != nil:
		for _, sm := range in.GetAllowOrigins() {
			if m := stringMatcher(sm); m != nil {
				out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, m)
			}
		}
	case old != nil:
		for _, o := range old {
			out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: o}})
		}
	}
	if in.GetMaxAge() != nil {
		out.MaxAge = strconv.FormatInt(in.GetMaxAge().GetSeconds(), 10)
	}
	return out
}

// translateDirectResponse answers a request with a status and body.
func translateDirectResponse(in *networkingapi.HTTPDirectResponse) *routev3.DirectResponseAction {
	out := &routev3.DirectResponseAction{Status: in.GetStatus()}
	switch b := in.GetBody().GetSpecifier().(type) {
	case *networkingapi.HTTPBody_String_:
		out.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: b.String_}}
	case *networkingapi.HTTPBody_Bytes:
		out.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b.Bytes}}
	}
	return out
}

// pathOf describes a match's path for a route's decorator.
func pathOf(m *routev3.RouteMatch) string {
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		return ps.Prefix + "*"
	case *routev3.RouteMatch_Path:
		return ps.Path
	case *routev3.RouteMatch_SafeRegex:
		return ps.SafeRegex.GetRegex()
	}
	return ""
}

// translateRetry: no policy is the default; attempts 0 turns retries off.
// hashed: the route's one destination is consistently hashed.
func translateRetry(r *networkingapi.HTTPRetry, hashed bool) *routev3.RetryPolicy {
	if r == nil {
		return defaultRetry(hashed)
	}
	if r.GetAttempts() <= 0 {
		return nil
	}
	p := defaultRetry(hashed)
	p.NumRetries = wrapperspb.UInt32(uint32(r.GetAttempts()))
	if r.GetPerTryTimeout() != nil {
		p.PerTryTimeout = r.GetPerTryTimeout()
	}
	if on := r.GetRetryOn(); on != "" {
		var kinds []string
		for _, k := range strings.Split(on, ",") {
			k = strings.TrimSpace(k)
			if code, ok := statusCode(k); ok {
				p.RetriableStatusCodes = append(p.RetriableStatusCodes, code)
				continue
			}
			if k != "" {
				kinds = append(kinds, k)
			}
		}
		p.RetryOn = strings.Join(kinds, ",")
		if len(p.RetriableStatusCodes) > 0 && !strings.Contains(p.RetryOn, "retriable-status-codes") {
			p.RetryOn += ",retriable-status-codes"
		}
	}
	if ignore := r.GetRetryIgnorePreviousHosts(); ignore != nil {
		p.RetryHostPredicate = nil
		if ignore.GetValue() {
			p.RetryHostPredicate = defaultRetry(false).RetryHostPredicate
		}
	}
	if r.GetRetryRemoteLocalities().GetValue() {
		// Each retry goes to the next priority (locality) in turn.
		p.RetryPriority = &routev3.RetryPolicy_RetryPriority{
			Name:       "envoy.retry_priorities.previous_priorities",
			ConfigType: &routev3.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: mustAny(&previousprioritiesv3.PreviousPrioritiesConfig{UpdateFrequency: 2})},
		}
	}
	if b := r.GetBackoff(); b != nil {
		p.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: b}
	}
	return p
}

// statusCode parses an HTTP status code among a retryOn's conditions:
// a number that names a status.
func statusCode(s string) (uint32, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || http.StatusText(n) == "" {
		return 0, false
	}
	return uint32(n), true
}

// translateMatch turns an HTTP match into a route match; nil matches all.
func translateMatch(mr *networkingapi.HTTPMatchRequest) *routev3.RouteMatch {
	out := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	if mr == nil {
		return out
	}
	for name, sm := range mr.GetHeaders() {
		out.Headers = append(out.Headers, headerMatch(name, sm))
	}
	for name, sm := range mr.GetWithoutHeaders() {
		h := headerMatch(name, sm)
		h.InvertMatch = true
		if !h.GetPresentMatch() {
			h.TreatMissingHeaderAsEmpty = true
		}
		out.Headers = append(out.Headers, h)
	}
	slices.SortFunc(out.Headers, func(a, b *routev3.HeaderMatcher) int { return strings.Compare(a.GetName(), b.GetName()) })
	switch u := mr.GetUri().GetMatchType().(type) {
	case *networkingapi.StringMatch_Exact:
		out.PathSpecifier = &routev3.RouteMatch_Path{Path: u.Exact}
	case *networkingapi.StringMatch_Prefix:
		out.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: u.Prefix}
	case *networkingapi.StringMatch_Regex:
		out.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: u.Regex}}
	}
	out.CaseSensitive = wrapperspb.Bool(!mr.GetIgnoreUriCase())
	for _, name := range slices.Sorted(maps.Keys(mr.GetQueryParams())) {
		q := &routev3.QueryParameterMatcher{Name: name}
		if sm := stringMatcher(mr.GetQueryParams()[name]); sm != nil {
			q.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_StringMatch{StringMatch: sm}
		} else {
			q.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}
		}
		out.QueryParameters = append(out.QueryParameters, q)
	}
	for _, h := range []struct {
		name string
		sm   *networkingapi.StringMatch
	}{{":method", mr.GetMethod()}, {":authority", mr.GetAuthority()}, {":scheme", mr.GetScheme()}} {
		if h.sm != nil {
			out.Headers = append(out.Headers, headerMatch(h.name, h.sm))
		}
	}
	return out
}

// headerMatch: a match of no kind, an empty prefix or the regex "*" (not
// a regular expression) only asks that the header be present.
func headerMatch(name string, sm *networkingapi.StringMatch) *routev3.HeaderMatcher {
	out := &routev3.HeaderMatcher{Name: name}
	if m := stringMatcher(sm); m != nil {
		out.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: m}
	} else {
		out.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
	}
	return out
}

// stringMatcher is an exact, prefix or regex match as written; nil for a
// match of no kind, an empty prefix or the regex "*", which match any
// value. (Istio's control plane sends an empty prefix as written, which
// Envoy's validation rejects: a prefix has at least one character.)
func stringMatcher(sm *networkingapi.StringMatch) *matcherv3.StringMatcher {
	switch v := sm.GetMatchType().(type) {
	case *networkingapi.StringMatch_Exact:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v.Exact}}
	case *networkingapi.StringMatch_Prefix:
		if v.Prefix != "" {
			return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: v.Prefix}}
		}
	case *networkingapi.StringMatch_Regex:
		if v.Regex != "*" {
			return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: v.Regex}}}
		}
	}
	return nil
}

// translateFault is a route's fault filter configuration: a fixed delay
// and an HTTP or gRPC abort, each for a share of requests (percentages in
// millionths; the deprecated integer percent in hundredths); nil when
// neither is set. Exponential delays are not supported.
func translateFault(in *networkingapi.HTTPFaultInjection) *faultv3.HTTPFault {
	if in == nil {
		return nil
	}
	out := &faultv3.HTTPFault{}
	if d := in.GetDelay(); d.GetFixedDelay() != nil {
		//lint:ignore SA1019 the deprecated integer percent still counts when no percentage is set
		percent := d.GetPercent()
		out.Delay = &commonfaultv3.FaultDelay{
			FaultDelaySecifier: &commonfaultv3.FaultDelay_FixedDelay{FixedDelay: d.GetFixedDelay()},
			Percentage:         percentage(d.GetPercentage(), percent),
		}
	}
	if a := in.GetAbort(); a != nil {
		abort := &faultv3.FaultAbort{}
		if p := a.GetPercentage(); p != nil {
			abort.Percentage = percentage(p, 0)
		}
		switch e := a.GetErrorType().(type) {
		case *networkingapi.HTTPFaultInjection_Abort_HttpStatus:
			abort.ErrorType = &faultv3.FaultAbort_HttpStatus{HttpStatus: uint32(e.HttpStatus)}
			out.Abort = abort
		case *networkingapi.HTTPFaultInjection_Abort_GrpcStatus:
			var c codes.Code
			if err := c.UnmarshalJSON([]byte(strconv.Quote(e.GrpcStatus))); err == nil {
				abort.ErrorType = &faultv3.FaultAbort_GrpcStatus{GrpcStatus: uint32(c)}
				out.Abort = abort
			}
		}
	}
	if out.Delay == nil && out.Abort == nil {
		return nil
	}
	return out
}

// percentage is p in millionths, else the integer percent.
func percentage(p *networkingapi.Percent, percent int32) *typev3.FractionalPercent {
	if p != nil {
		return &typev3.FractionalPercent{Numerator: uint32(p.GetValue() * 10000), Denominator: typev3.FractionalPercent_MILLION}
	}
	return &typev3.FractionalPercent{Numerator: uint32(percent), Denominator: typev3.FractionalPercent_HUNDRED}
}

// translateRedirect redirects a request of port port: a prefix or path
// rewrite, the authority, the scheme, the port (the request's own for
// FROM_REQUEST_PORT; none when it is the scheme's default), the code. An
// unsupported code redirects nothing (validation refuses it first).
func translateRedirect(rd *networkingapi.HTTPRedirect, port uint32) *routev3.RedirectAction {
	out := &routev3.RedirectAction{HostRedirect: rd.GetAuthority()}
	if rd.GetPrefixRewrite() != "" {
		out.PathRewriteSpecifier = &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: rd.GetPrefixRewrite()}
	} else {
		out.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: rd.GetUri()}
	}
	if s := rd.GetScheme(); s != "" {
		out.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: s}
	}
	if rd.GetRedirectPort() != nil {
		switch rp := rd.GetRedirectPort().(type) {
		case *networkingapi.HTTPRedirect_DerivePort:
			if rp.DerivePort == networkingapi.HTTPRedirect_FROM_REQUEST_PORT {
				out.PortRedirect = port
			}
		case *networkingapi.HTTPRedirect_Port:
			out.PortRedirect = rp.Port
		}
		scheme := cmp.Or(rd.GetScheme(), "http")
		if out.PortRedirect == 80 && scheme == "http" || out.PortRedirect == 443 && scheme == "https" {
			out.PortRedirect = 0
		}
	}
	switch rd.GetRedirectCode() {
	case 0, 301:
		out.ResponseCode = routev3.RedirectAction_MOVED_PERMANENTLY
	case 302:
		out.ResponseCode = routev3.RedirectAction_FOUND
	case 303:
		out.ResponseCode = routev3.RedirectAction_SEE_OTHER
	case 307:
		out.ResponseCode = routev3.RedirectAction_TEMPORARY_REDIRECT
	case 308:
		out.ResponseCode = routev3.RedirectAction_PERMANENT_REDIRECT
	default:
		return nil
	}
	return out
}

func u32(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// configMetadata names the VirtualService a route comes from, as
// "/apis/<group>/<version>/namespaces/<ns>/virtual-service/<name>" under
// filter_metadata "istio", key "config".
func configMetadata(vs *networkingv1.VirtualService) *corev3.Metadata {
	path := "/apis/networking.istio.io/v1/namespaces/" + vs.Namespace + "/virtual-service/" + vs.Name
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		"istio": {Fields: map[string]*structpb.Value{"config": structpb.NewStringValue(path)}},
	}}
}

// destinationHash is the consistent hash the DestinationRule of host sets
// for a route to port (0: none named) and subset: the subset's port-level
// setting, else the subset's, else the rule's port-level setting, else the
// rule's.
func (m *Mesh) destinationHash(p Proxy, host string, port uint32, subsetName string) *networkingapi.LoadBalancerSettings_ConsistentHashLB {
	svcNS := ""
	if svc := m.Service(p, host); svc != nil {
		svcNS = svc.GetNamespace()
	}
	dr := m.DestinationRule(p, host, svcNS)
	if dr == nil || m.refused(dr) {
		return nil
	}
	if subsetName != "" {
		if ss := subset(dr, subsetName); ss != nil {
			if h := portHash(ss.GetTrafficPolicy(), port); h != nil {
				return h
			}
		}
	}
	return portHash(dr.Spec.GetTrafficPolicy(), port)
}

// portHash is a traffic policy's consistent hash for port: the port-level
// one, else the policy's own.
func portHash(tp *networkingapi.TrafficPolicy, port uint32) *networkingapi.LoadBalancerSettings_ConsistentHashLB {
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			if h := pl.GetLoadBalancer().GetConsistentHash(); h != nil {
				return h
			}
			break
		}
	}
	return tp.GetLoadBalancer().GetConsistentHash()
}

// hashPolicy is what a route hashes on for a consistent hash: a header, a
// cookie, the source address or a query parameter; nil for none.
func hashPolicy(h *networkingapi.LoadBalancerSettings_ConsistentHashLB) *routev3.RouteAction_HashPolicy {
	switch k := h.GetHashKey().(type) {
	case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		return &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
			Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: k.HttpHeaderName}}}
	case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		c := &routev3.RouteAction_HashPolicy_Cookie{Name: k.HttpCookie.GetName(), Ttl: k.HttpCookie.GetTtl(), Path: k.HttpCookie.GetPath()}
		for _, a := range k.HttpCookie.GetAttributes() {
			c.Attributes = append(c.Attributes, &routev3.RouteAction_HashPolicy_CookieAttribute{Name: a.GetName(), Value: a.GetValue()})
		}
		return &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Cookie_{Cookie: c}}
	case *networkingapi.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		return &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_ConnectionProperties_{
			ConnectionProperties: &routev3.RouteAction_HashPolicy_ConnectionProperties{SourceIp: k.UseSourceIp}}}
	case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		return &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_QueryParameter_{
			QueryParameter: &routev3.RouteAction_HashPolicy_QueryParameter{Name: k.HttpQueryParameterName}}}
	}
	return nil
}
