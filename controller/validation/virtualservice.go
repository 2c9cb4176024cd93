package validation

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	networkingapi "istio.io/api/networking/v1"
)

// VirtualServiceCheck is what is wrong with a VirtualService, by part, so
// that a generator can drop an HTTP route alone.
type VirtualServiceCheck struct {
	// Spec is what is wrong outside the routes: hosts, gateways, exportTo,
	// a VirtualService without routes. It concerns the whole object.
	Spec error
	// HTTP is what is wrong with each HTTP route, by its index in
	// spec.http; routes without problems are absent.
	HTTP map[int]error
	// Other is what is wrong with the TCP and TLS routes, which sidecars
	// then do not get.
	Other error
}

// Err is every problem, for the webhook: Spec's, then the HTTP routes' in
// order, then Other's; nil for none.
func (c VirtualServiceCheck) Err() error {
	var out errs
	out.add(c.Spec)
	for _, i := range sortedInts(c.HTTP) {
		out.add(c.HTTP[i])
	}
	out.add(c.Other)
	return out.err()
}

// VirtualService checks a VirtualService of namespace as Istio's webhook
// does, and as Envoy and grpc-go take its translation.
func VirtualService(namespace string, vs *networkingapi.VirtualService) error {
	return CheckVirtualService(namespace, vs).Err()
}

// CheckVirtualService checks a VirtualService of namespace part by part.
func CheckVirtualService(namespace string, vs *networkingapi.VirtualService) VirtualServiceCheck {
	var spec, other errs
	delegate := len(vs.GetHosts()) == 0
	if delegate {
		if len(vs.GetGateways()) != 0 {
			spec.addf("delegate virtual service must have no gateways specified")
		}
		if len(vs.GetTls()) != 0 {
			spec.addf("delegate virtual service must have no tls route specified")
		}
		if len(vs.GetTcp()) != 0 {
			spec.addf("delegate virtual service must have no tcp route specified")
		}
	}
	// Bound to gateways only when "mesh" is not among its gateways.
	gateway := len(vs.GetGateways()) > 0 && !slices.Contains(vs.GetGateways(), "mesh")
	spec.add(gatewayNames(vs.GetGateways()))

	allHostsValid := true
	for _, h := range vs.GetHosts() {
		var err error
		if gateway {
			err = gatewayHost(h, sniHosts(vs))
		} else {
			err = Host(h)
		}
		switch {
		case err != nil && !isIP(h):
			spec.add(err)
			allHostsValid = false
		case err == nil && !gateway && h == "*":
			spec.addf("wildcard host * is not allowed for virtual services bound to the mesh gateway")
			allHostsValid = false
		}
	}
	if allHostsValid {
		hosts := vs.GetHosts()
		for i := range hosts {
			for j := i + 1; j < len(hosts); j++ {
				if hostsOverlap(hosts[i], hosts[j]) {
					spec.addf("duplicate hosts in virtual service: %s & %s", hosts[i], hosts[j])
				}
			}
		}
	}
	if len(vs.GetHttp()) == 0 && len(vs.GetTcp()) == 0 && len(vs.GetTls()) == 0 {
		spec.addf("http, tcp or tls must be provided in virtual service")
	}
	spec.add(exportTo(namespace, vs.GetExportTo(), false, false))

	check := VirtualServiceCheck{Spec: spec.err()}
	for i, hr := range vs.GetHttp() {
		if err := httpRoute(hr, delegate, gateway); err != nil {
			if check.HTTP == nil {
				check.HTTP = map[int]error{}
			}
			check.HTTP[i] = err
		}
	}
	for _, r := range vs.GetTls() {
		other.add(tlsRoute(r, vs, gateway))
	}
	for _, r := range vs.GetTcp() {
		other.add(tcpRoute(r))
	}
	check.Other = other.err()
	return check
}

// HTTPRoute checks one HTTP route of a VirtualService that applies to
// sidecars (not a delegate, not bound to gateways only).
func HTTPRoute(hr *networkingapi.HTTPRoute) error {
	return httpRoute(hr, false, false)
}

func httpRoute(hr *networkingapi.HTTPRoute, delegate, gateway bool) error {
	if hr == nil {
		return errors.New("http route may not be null")
	}
	var out errs
	out.add(httpRouteConflict(hr, delegate))
	out.add(httpMatches(hr, gateway))

	out.add(headerOperations(hr.GetHeaders()))
	out.add(corsPolicy(hr.GetCorsPolicy()))
	out.add(faultInjection(hr.GetFault()))
	//lint:ignore SA1019 Istio still checks the deprecated field
	if mp := hr.GetMirrorPercent(); mp != nil {
		if v := mp.GetValue(); v > 100 {
			out.addf("mirror_percent must have a max value of 100 (it has %d)", v)
		}
	}
	if mp := hr.GetMirrorPercentage(); mp != nil {
		if v := mp.GetValue(); v > 100 {
			out.addf("mirror_percentage must have a max value of 100 (it has %f)", v)
		} else if v < 0 || math.IsNaN(v) {
			out.addf("mirror_percentage must have a min value of 0 (it has %f)", v)
		}
	}
	out.add(destination(hr.GetMirror()))
	out.add(mirrors(hr.GetMirrors()))
	out.add(redirect(hr.GetRedirect(), hr.GetMatch()))
	out.add(directResponse(hr.GetDirectResponse()))
	out.add(retry(hr.GetRetries()))
	out.add(rewrite(hr.GetRewrite()))
	out.add(authorityRewrite(hr.GetRewrite(), hr.GetHeaders()))
	out.add(httpDestinations(hr.GetRoute()))
	if hr.GetTimeout() != nil {
		out.add(Duration(hr.GetTimeout()))
	}
	return out.err()
}

func httpRouteConflict(hr *networkingapi.HTTPRoute, delegate bool) error {
	var out errs
	if !delegate && hr.GetDelegate() != nil {
		// A root route only delegates.
		if hr.GetRedirect() != nil {
			out.addf("root HTTP route %s must not specify redirect", hr.GetName())
		}
		if hr.GetRoute() != nil {
			out.addf("root HTTP route %s must not specify route", hr.GetName())
		}
		return out.err()
	}
	if delegate && hr.GetDelegate() != nil {
		out.addf("delegate HTTP route cannot contain delegate")
	}
	switch {
	case hr.GetRedirect() != nil:
		if len(hr.GetRoute()) > 0 {
			out.addf("HTTP route cannot contain both route and redirect")
		}
		if hr.GetFault() != nil {
			out.addf("HTTP route cannot contain both fault and redirect")
		}
		if hr.GetRewrite() != nil {
			out.addf("HTTP route rule cannot contain both rewrite and redirect")
		}
		if hr.GetDirectResponse() != nil {
			out.addf("HTTP route rule cannot contain both direct_response and redirect")
		}
	case hr.GetDirectResponse() != nil:
		if len(hr.GetRoute()) > 0 {
			out.addf("HTTP route cannot contain both route and direct_response")
		}
		if hr.GetFault() != nil {
			out.addf("HTTP route cannot contain both fault and direct_response")
		}
		if hr.GetRewrite() != nil {
			out.addf("HTTP route rule cannot contain both rewrite and direct_response")
		}
	case len(hr.GetRoute()) == 0:
		out.addf("HTTP route, redirect or direct_response is required")
	}
	if hr.GetMirror() != nil && len(hr.GetMirrors()) > 0 {
		out.addf("HTTP route cannot contain both mirror and mirrors")
	}
	return out.err()
}

// maxQueryParamName is the longest query parameter name Envoy matches on
// (QueryParameterMatcher.name).
const maxQueryParamName = 1024

func httpMatches(hr *networkingapi.HTTPRoute, gateway bool) error {
	var out errs
	for _, m := range hr.GetMatch() {
		if m == nil {
			continue
		}
		for _, name := range sortedKeys(m.GetHeaders()) {
			h := m.GetHeaders()[name]
			if h == nil {
				out.addf("header match %v cannot be null", name)
			}
			out.add(HeaderName(name), stringMatch(h, "headers"))
			if !gateway && isJWTClaimRoute(name) {
				out.addf("JWT claim based routing (key: %s) is only supported for gateway, found no gateways", name)
			}
		}
		for _, name := range sortedKeys(m.GetWithoutHeaders()) {
			h := m.GetWithoutHeaders()[name]
			out.add(HeaderName(name))
			// "*" is not a regex: it asks that the header be absent.
			if h != nil && h.GetRegex() != "*" {
				out.add(stringMatch(h, "withoutHeaders"))
			}
			if !gateway && isJWTClaimRoute(name) {
				out.addf("JWT claim based routing (key: %s) is only supported for gateway, found no gateways", name)
			}
		}
		out.add(stringMatchRegex(m.GetUri(), "uri"))
		out.add(headerField(uriText(m.GetUri()), "uri"))
		out.add(stringMatch(m.GetScheme(), "scheme"))
		out.add(stringMatch(m.GetMethod(), "method"))
		out.add(stringMatch(m.GetAuthority(), "authority"))
		for _, name := range sortedKeys(m.GetQueryParams()) {
			out.add(stringMatch(m.GetQueryParams()[name], "queryParams"))
			// Envoy's QueryParameterMatcher takes 1 to 1024 bytes.
			if name == "" || len(name) > maxQueryParamName {
				out.addf("query parameter name %q must be 1 to %d bytes long", name, maxQueryParamName)
			}
		}
		if m.GetPort() != 0 {
			out.add(Port(int64(m.GetPort())))
		}
		out.add(labels(m.GetSourceLabels()))
		out.add(gatewayNames(m.GetGateways()))
		if ns := m.GetSourceNamespace(); ns != "" && !dns1123Label(ns) {
			out.addf("sourceNamespace match %s is invalid", ns)
		}
	}
	return out.err()
}

// uriText is a URI match's exact or prefix text, which Envoy takes as a
// path and refuses NUL, CR and LF in.
func uriText(sm *networkingapi.StringMatch) string {
	switch sm.GetMatchType().(type) {
	case *networkingapi.StringMatch_Exact:
		return sm.GetExact()
	case *networkingapi.StringMatch_Prefix:
		return sm.GetPrefix()
	}
	return ""
}

func headerOperations(h *networkingapi.Headers) error {
	var out errs
	req, resp := h.GetRequest(), h.GetResponse()
	for _, name := range sortedKeys(req.GetAdd()) {
		out.add(headerSetName(name), headerValue(req.GetAdd()[name]))
	}
	for _, name := range sortedKeys(req.GetSet()) {
		out.add(headerSetName(name), headerValue(req.GetSet()[name]))
	}
	for _, name := range req.GetRemove() {
		out.add(headerOperationName(name))
	}
	for _, name := range sortedKeys(resp.GetAdd()) {
		out.add(headerOperationName(name), headerValue(resp.GetAdd()[name]))
	}
	for _, name := range sortedKeys(resp.GetSet()) {
		out.add(headerOperationName(name), headerValue(resp.GetSet()[name]))
	}
	for _, name := range resp.GetRemove() {
		out.add(headerOperationName(name))
	}
	return out.err()
}

// authorityRewrite: the authority may be rewritten in one place only.
func authorityRewrite(rw *networkingapi.HTTPRewrite, h *networkingapi.Headers) error {
	current := rw.GetAuthority()
	for _, ops := range []map[string]string{h.GetRequest().GetSet(), h.GetRequest().GetAdd()} {
		for _, k := range sortedKeys(ops) {
			if !isAuthorityHeader(k) {
				continue
			}
			if current != "" {
				return fmt.Errorf("authority header cannot be set multiple times: have %q, attempting to set %q", current, ops[k])
			}
			current = ops[k]
		}
	}
	return nil
}

// corsMethods are the methods a CORS policy may allow.
var corsMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace, "*"}

func corsPolicy(p *networkingapi.CorsPolicy) error {
	if p == nil {
		return nil
	}
	var out errs
	for _, o := range p.GetAllowOrigins() {
		var text string
		switch o.GetMatchType().(type) {
		case *networkingapi.StringMatch_Exact:
			text = o.GetExact()
		case *networkingapi.StringMatch_Prefix:
			text = o.GetPrefix()
		case *networkingapi.StringMatch_Regex:
			text = o.GetRegex()
		}
		if text == "" {
			out.addf("'%v' is not a valid match type for CORS allow origins", text)
			continue
		}
		out.add(stringMatchRegex(o, "corsPolicy.allowOrigins"))
	}
	for _, m := range p.GetAllowMethods() {
		if !slices.Contains(corsMethods, m) {
			out.addf("%q is not a supported HTTP method", m)
		}
	}
	for _, names := range [][]string{p.GetAllowHeaders(), p.GetExposeHeaders()} {
		for _, n := range names {
			switch {
			case n == "":
				out.addf("header name cannot be empty")
			case n != "*" && !isToken(n):
				out.addf("header name %s is not a valid header name", n)
			}
		}
	}
	if p.GetMaxAge() != nil {
		out.add(Duration(p.GetMaxAge()))
		if p.GetMaxAge().GetNanos() > 0 {
			out.addf("max_age duration is accurate only to seconds precision")
		}
	}
	return out.err()
}

// grpcStatuses are the gRPC status names an abort may return.
var grpcStatuses = []string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func faultInjection(f *networkingapi.HTTPFaultInjection) error {
	if f == nil {
		return nil
	}
	var out errs
	if f.GetAbort() == nil && f.GetDelay() == nil {
		out.addf("HTTP fault injection must have an abort and/or a delay")
	}
	if a := f.GetAbort(); a != nil {
		out.add(Percentage(a.GetPercentage()))
		switch a.GetErrorType().(type) {
		case *networkingapi.HTTPFaultInjection_Abort_GrpcStatus:
			if !slices.Contains(grpcStatuses, a.GetGrpcStatus()) {
				out.addf("gRPC status %q is not supported. See https://github.com/grpc/grpc/blob/master/doc/statuscodes.md "+
					"for a list of supported codes, for example 'NOT_FOUND'", a.GetGrpcStatus())
			}
		case *networkingapi.HTTPFaultInjection_Abort_Http2Error:
			out.addf("HTTP/2 abort fault injection not supported yet")
		case *networkingapi.HTTPFaultInjection_Abort_HttpStatus:
			// Envoy's FaultAbort takes 200 to 599; Istio's check lets 600
			// through.
			if s := a.GetHttpStatus(); s < 200 || s > 599 {
				out.addf("HTTP status %d is not in range 200-599", s)
			}
		}
	}
	if d := f.GetDelay(); d != nil {
		out.add(Percentage(d.GetPercentage()))
		//lint:ignore SA1019 sidecars apply the deprecated integer percent when no percentage is set
		out.add(Percent(d.GetPercent()))
		switch d.GetHttpDelayType().(type) {
		case *networkingapi.HTTPFaultInjection_Delay_FixedDelay:
			out.add(Duration(d.GetFixedDelay()))
		case *networkingapi.HTTPFaultInjection_Delay_ExponentialDelay:
			out.add(Duration(d.GetExponentialDelay()))
			out.addf("exponentialDelay not supported yet")
		}
	}
	return out.err()
}

// destination checks where a route, mirror or egress proxy sends to.
func destination(d *networkingapi.Destination) error {
	if d == nil {
		return nil
	}
	var out errs
	if d.GetHost() == "*" {
		out.addf("invalid destination host %s", d.GetHost())
	} else {
		out.add(Host(d.GetHost()))
	}
	if d.GetSubset() != "" {
		out.add(subsetName(d.GetSubset()))
	}
	if d.GetPort() != nil {
		out.add(Port(int64(d.GetPort().GetNumber())))
	}
	return out.err()
}

func subsetName(name string) error {
	if name == "" {
		return errors.New("subset name cannot be empty")
	}
	if !dns1123Label(name) {
		return fmt.Errorf("subset name is invalid: %s", name)
	}
	return nil
}

func mirrors(ms []*networkingapi.HTTPMirrorPolicy) error {
	var out errs
	for _, m := range ms {
		switch {
		case m == nil:
			out.addf("mirror cannot be null")
			continue
		case m.GetDestination() == nil:
			out.addf("destination is required for mirrors")
			continue
		}
		out.add(destination(m.GetDestination()))
		if p := m.GetPercentage(); p != nil {
			if v := p.GetValue(); v > 100 {
				out.addf("mirror percentage must have a max value of 100 (it has %f)", v)
			} else if v < 0 || math.IsNaN(v) {
				out.addf("mirror percentage must have a min value of 0 (it has %f)", v)
			}
		}
	}
	return out.err()
}

func redirect(rd *networkingapi.HTTPRedirect, matches []*networkingapi.HTTPMatchRequest) error {
	if rd == nil {
		return nil
	}
	if rd.GetUri() != "" && rd.GetPrefixRewrite() != "" {
		return errors.New("redirect may only specify one of uri or prefix_rewrite")
	}
	if rd.GetPrefixRewrite() != "" {
		for _, m := range matches {
			if _, prefix := m.GetUri().GetMatchType().(*networkingapi.StringMatch_Prefix); m.GetUri() != nil && !prefix {
				return errors.New("redirect prefix_rewrite requires all URI matches to use prefix match type")
			}
		}
	}
	if rd.GetUri() == "" && rd.GetPrefixRewrite() == "" && rd.GetAuthority() == "" && rd.GetRedirectPort() == nil && rd.GetScheme() == "" {
		return errors.New("redirect must specify URI, authority, scheme, or port")
	}
	if c := rd.GetRedirectCode(); c != 0 && (c < 300 || c > 399) {
		return fmt.Errorf("%d is not a valid redirect code, must be 3xx", c)
	}
	if s := rd.GetScheme(); s != "" && s != "http" && s != "https" {
		return errors.New(`invalid redirect scheme, must be "http" or "https"`)
	}
	if rd.GetPort() > 0 {
		if err := Port(int64(rd.GetPort())); err != nil {
			return err
		}
	}
	var out errs
	out.add(headerField(rd.GetUri(), "redirect uri"), headerField(rd.GetPrefixRewrite(), "redirect prefixRewrite"),
		headerField(rd.GetAuthority(), "redirect authority"))
	return out.err()
}

func directResponse(dr *networkingapi.HTTPDirectResponse) error {
	if dr == nil {
		return nil
	}
	var out errs
	size := 0
	switch b := dr.GetBody().GetSpecifier().(type) {
	case *networkingapi.HTTPBody_String_:
		size = len(b.String_)
	case *networkingapi.HTTPBody_Bytes:
		size = len(b.Bytes)
	}
	if size > 1<<20 {
		out.addf("large direct_responses may impact control plane performance, must be less than 1MB")
	}
	if s := dr.GetStatus(); s < 200 || s > 599 {
		out.addf("HTTP status %d is not in range 200-599", s)
	}
	return out.err()
}

// retryOns are the retry conditions Envoy knows besides status codes.
var retryOns = []string{"5xx", "gateway-error", "reset", "reset-before-request", "connect-failure", "retriable-4xx",
	"refused-stream", "retriable-status-codes", "retriable-headers", "envoy-ratelimited", "http3-post-connect-failure",
	"cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable"}

func retry(r *networkingapi.HTTPRetry) error {
	if r == nil {
		return nil
	}
	var out errs
	if r.GetAttempts() < 0 {
		out.addf("attempts cannot be negative")
	}
	if r.GetAttempts() == 0 && (r.GetPerTryTimeout() != nil || r.GetRetryOn() != "" || r.GetRetryRemoteLocalities() != nil) {
		out.addf("http retry policy configured when attempts are set to 0 (disabled)")
	}
	if r.GetPerTryTimeout() != nil {
		out.add(Duration(r.GetPerTryTimeout()))
	}
	if on := r.GetRetryOn(); on != "" {
		for _, p := range strings.Split(on, ",") {
			code, _ := strconv.Atoi(p)
			if http.StatusText(code) == "" && !slices.Contains(retryOns, p) {
				out.addf("%q is not a valid retryOn policy", p)
			}
		}
	}
	if r.GetBackoff() != nil {
		out.add(Duration(r.GetBackoff()))
	}
	return out.err()
}

func rewrite(rw *networkingapi.HTTPRewrite) error {
	if rw == nil {
		return nil
	}
	if rw.GetUri() != "" && rw.GetUriRegexRewrite() != nil {
		return errors.New("rewrite may only contain one of URI or UriRegexRewrite")
	}
	if rw.GetUri() == "" && rw.GetUriRegexRewrite() == nil && rw.GetAuthority() == "" {
		return errors.New("rewrite must specify at least one of URI, UriRegexRewrite, or authority. Only one of URI or UriRegexRewrite may be specified")
	}
	if rr := rw.GetUriRegexRewrite(); rr != nil {
		if rr.GetMatch() == "" || rr.GetRewrite() == "" {
			return errors.New("UriRegexRewrite has errors: UriRegexRewrite requires both Rewrite and Match fields to be specified")
		}
		if err := Regex(rr.GetMatch(), "HTTPRewrite.UriRegexRewrite.Match"); err != nil {
			return fmt.Errorf("UriRegexRewrite has errors: %w", err)
		}
	}
	var out errs
	out.add(headerField(rw.GetUri(), "rewrite uri"), headerField(rw.GetAuthority(), "rewrite authority"))
	return out.err()
}

// httpDestinations checks a route's destinations and their weights: none
// negative, not all 0 when there are several, and (as Envoy and grpc-go
// require of a weighted cluster) summing to at most 2^32-1.
func httpDestinations(ds []*networkingapi.HTTPRouteDestination) error {
	var out errs
	var total int64
	for _, d := range ds {
		if d == nil {
			out.addf("weight may not be nil")
			continue
		}
		if d.GetDestination() == nil {
			out.addf("destination is required")
		}
		out.add(headerOperations(d.GetHeaders()), destination(d.GetDestination()))
		if d.GetWeight() < 0 {
			out.addf("weight %d < 0", d.GetWeight())
		} else {
			total += int64(d.GetWeight())
		}
	}
	if len(ds) > 1 && total == 0 {
		out.addf("total destination weight = 0")
	}
	if total > math.MaxUint32 {
		out.addf("total destination weight %d is larger than %d", total, uint32(math.MaxUint32))
	}
	return out.err()
}

func routeDestinations(ds []*networkingapi.RouteDestination) error {
	var out errs
	var total int64
	for _, d := range ds {
		if d == nil {
			out.addf("weight may not be nil")
			continue
		}
		if d.GetDestination() == nil {
			out.addf("destination is required")
		}
		out.add(destination(d.GetDestination()))
		if d.GetWeight() < 0 {
			out.addf("weight %d < 0", d.GetWeight())
		} else {
			total += int64(d.GetWeight())
		}
	}
	if len(ds) > 1 && total == 0 {
		out.addf("total destination weight = 0")
	}
	return out.err()
}

func tlsRoute(r *networkingapi.TLSRoute, vs *networkingapi.VirtualService, gateway bool) error {
	if r == nil {
		return nil
	}
	var out errs
	if len(r.GetMatch()) == 0 {
		out.addf("TLS route must have at least one match condition")
	}
	for _, m := range r.GetMatch() {
		if m == nil {
			out.addf("TLS match may not be null")
			continue
		}
		if len(m.GetSniHosts()) == 0 {
			out.addf("TLS match must have at least one SNI host")
		}
		for _, sni := range m.GetSniHosts() {
			out.add(sniHost(sni, vs, gateway))
		}
		for _, s := range m.GetDestinationSubnets() {
			out.add(ipOrSubnet(s))
		}
		if m.GetPort() != 0 {
			out.add(Port(int64(m.GetPort())))
		}
		out.add(labels(m.GetSourceLabels()), gatewayNames(m.GetGateways()))
	}
	if len(r.GetRoute()) == 0 {
		out.addf("TLS route is required")
	}
	out.add(routeDestinations(r.GetRoute()))
	return out.err()
}

func sniHost(sni string, vs *networkingapi.VirtualService, gateway bool) error {
	var err error
	if gateway {
		err = gatewayHost(sni, true)
	} else {
		err = Host(sni)
	}
	if err != nil {
		if isIP(sni) {
			return nil // a warning in Istio
		}
		return err
	}
	for _, h := range vs.GetHosts() {
		if hostSubsetOf(sni, h) {
			return nil
		}
	}
	return fmt.Errorf("SNI host %q is not a compatible subset of any of the virtual service hosts: [%s]", sni, strings.Join(vs.GetHosts(), ", "))
}

func tcpRoute(r *networkingapi.TCPRoute) error {
	if r == nil {
		return nil
	}
	var out errs
	for _, m := range r.GetMatch() {
		if m == nil {
			out.addf("tcp match may not be nil")
			continue
		}
		for _, s := range m.GetDestinationSubnets() {
			out.add(ipOrSubnet(s))
		}
		if m.GetPort() != 0 {
			out.add(Port(int64(m.GetPort())))
		}
		out.add(labels(m.GetSourceLabels()), gatewayNames(m.GetGateways()))
	}
	if len(r.GetRoute()) == 0 {
		out.addf("TCP route is required")
	}
	out.add(routeDestinations(r.GetRoute()))
	return out.err()
}

// gatewayHost checks a host of a VirtualService bound to gateways: as
// Host, or with SNI routes Istio's generated "outbound_.<port>_._.<host>".
func gatewayHost(h string, sni bool) error {
	if err := domainPreconditions(h); err != nil {
		return err
	}
	if sni && strings.HasPrefix(h, "outbound_") {
		parts := strings.Split(h, "_")
		if len(parts) < 4 {
			return fmt.Errorf("domain name %s invalid, should follow 'outbound_.<PORT>_._.<HOSTNAME>' format", h)
		}
		if parts[0] != "outbound" {
			return fmt.Errorf("domain name %q invalid (label %q invalid)", h, parts[0])
		}
		return nil
	}
	return Host(h)
}

func sniHosts(vs *networkingapi.VirtualService) bool {
	for _, r := range vs.GetTls() {
		for _, m := range r.GetMatch() {
			if len(m.GetSniHosts()) > 0 {
				return true
			}
		}
	}
	return false
}

func isIP(s string) bool {
	return ipOrSubnet(s) == nil && !strings.Contains(s, "/")
}

// hostsOverlap: one host matches the other ("*.foo.com" and "a.foo.com",
// "*.com" and "*.foo.com", or equal).
func hostsOverlap(a, b string) bool {
	return hostSubsetOf(a, b) || hostSubsetOf(b, a)
}

// hostSubsetOf reports whether every name a matches is matched by b.
func hostSubsetOf(a, b string) bool {
	if a == b {
		return true
	}
	if !strings.HasPrefix(b, "*") {
		return false
	}
	suffix := b[1:]
	if strings.HasPrefix(a, "*") {
		return strings.HasSuffix(a[1:], suffix)
	}
	return strings.HasSuffix(a, suffix)
}

func sortedInts[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
