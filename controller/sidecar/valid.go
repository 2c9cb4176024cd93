package sidecar

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/validation"
)

// What reaches a resource that many proxies share (the route
// configuration of a port holds the routes of every VirtualService for
// it) is checked first with controller/validation, Istio's rules, as the
// validating webhook checks objects: the webhook can be bypassed, and one
// regex RE2 does not compile would make Envoy refuse the whole route
// configuration for every sidecar of the mesh. What is refused is left out
// alone, and said (the index reports it as a Warning Event):
//
//   - an HTTP route of a VirtualService: that route, with all its matches;
//     requests it would have taken are matched against the routes after
//     it, as if it were not there;
//   - a VirtualService whose hosts, gateways or exportTo are refused: all
//     of it (its hosts get the default route);
//   - a DestinationRule: the clusters of its host, for the proxies that
//     would use it, are not sent (a route to them fails), nor its hash
//     policies; a proxy never gets less than the rule asked for, as
//     plaintext where it asked for TLS;
//   - a ServiceEntry host: the service of that host.
//
// AuthorizationPolicies and PeerAuthentications are not left out: that
// would open what they close; the generators enforce a value they cannot
// translate by denying more (authz.go). Sidecar resources only narrow what
// a proxy sees: a host that is refused matches nothing.

// VirtualServiceProblem says what sidecars do not get of vs, and why; ""
// when they get all of it.
func VirtualServiceProblem(vs *networkingv1.VirtualService) string {
	_, msg := usableVirtualService(vs)
	return joinProblems(msg, untranslatedProblem("VirtualService", &vs.Spec))
}

// joinProblems joins what is said of one object.
func joinProblems(msgs ...string) string {
	var out []string
	for _, m := range msgs {
		if m != "" {
			out = append(out, m)
		}
	}
	return strings.Join(out, "; ")
}

// SidecarProblem says which fields of a Sidecar resource sidecars get
// nothing of; "" when none.
func SidecarProblem(sc *networkingv1.Sidecar) string {
	return untranslatedProblem("Sidecar", &sc.Spec)
}

// DestinationRuleProblem says why sidecars do not get the clusters of
// dr's host that dr shapes, or which of its fields they get nothing of;
// "" when they get all of it.
func DestinationRuleProblem(dr *networkingv1.DestinationRule) string {
	if err := validation.DestinationRule(dr.Namespace, &dr.Spec); err != nil {
		return "sidecars that would use this rule get no cluster for host " + strconv.Quote(dr.Spec.GetHost()) +
			": the rule is invalid: " + validation.Summary(err)
	}
	return untranslatedProblem("DestinationRule", &dr.Spec)
}

// ServiceEntryProblem says which of se's hosts sidecars do not get, and
// why, and which of its fields they get nothing of; "" when they get all
// of it.
func ServiceEntryProblem(se *networkingv1.ServiceEntry) string {
	var out []string
	for _, h := range se.Spec.GetHosts() {
		if err := serviceHost(h); err != nil {
			out = append(out, fmt.Sprintf("host %q is not sent to sidecars: %s", h, validation.Summary(err)))
		}
	}
	return joinProblems(strings.Join(out, "; "), untranslatedProblem("ServiceEntry", &se.Spec))
}

// serviceHost checks a service's hostname, which becomes route
// configuration domains: Istio's host rules, and not "*", which would
// take every request of the port.
func serviceHost(h string) error {
	if h == "*" {
		return fmt.Errorf("invalid host %s", h)
	}
	return validation.Host(h)
}

// usableVirtualService is vs as sidecars get it: vs itself, a copy without
// the HTTP routes Istio's rules refuse (and without its TCP and TLS routes
// when any of those is refused), or nil when its spec is refused; with
// what was left out and why ("" for nothing).
func usableVirtualService(vs *networkingv1.VirtualService) (*networkingv1.VirtualService, string) {
	check := validation.CheckVirtualService(vs.Namespace, &vs.Spec)
	if check.Spec != nil {
		return nil, "sidecars do not get this VirtualService: " + validation.Summary(check.Spec)
	}
	var bad map[int]string
	for i, hr := range vs.Spec.GetHttp() {
		if check.HTTP[i] == nil {
			continue
		}
		// Canopy's translation sends an empty prefix or the regex "*" of
		// a header or query parameter as a match of its presence, which
		// Envoy and grpc-go take: those alone drop no route.
		if err := validation.HTTPRoute(presenceAsAny(hr)); err != nil {
			if bad == nil {
				bad = map[int]string{}
			}
			bad[i] = validation.Summary(err)
		}
	}
	if len(bad) == 0 && check.Other == nil {
		return vs, ""
	}
	out := vs.DeepCopy()
	routes := out.Spec.Http
	out.Spec.Http = nil
	var msgs []string
	if check.Other != nil {
		// Chains are built from every tcp or tls route at once: any
		// refused one could make Envoy refuse the whole listener.
		out.Spec.Tcp, out.Spec.Tls = nil, nil
		msgs = append(msgs, "its TCP and TLS routes: "+validation.Summary(check.Other))
	}
	for i, hr := range routes {
		if msg, ok := bad[i]; ok {
			name := "HTTP route " + strconv.Itoa(i)
			if hr.GetName() != "" {
				name += " (" + strconv.Quote(hr.GetName()) + ")"
			}
			msgs = append(msgs, name+": "+msg)
			continue
		}
		out.Spec.Http = append(out.Spec.Http, hr)
	}
	return out, "sidecars do not get " + strings.Join(msgs, "; ")
}

// presenceAsAny returns hr, or a copy of it whose header and query
// parameter matches of an empty prefix or the regex "*" match any value,
// as Canopy translates them.
func presenceAsAny(hr *networkingapi.HTTPRoute) *networkingapi.HTTPRoute {
	anyValue := func(sm *networkingapi.StringMatch) bool {
		switch v := sm.GetMatchType().(type) {
		case *networkingapi.StringMatch_Prefix:
			return v.Prefix == ""
		case *networkingapi.StringMatch_Regex:
			return v.Regex == "*"
		}
		return false
	}
	found := false
	for _, m := range hr.GetMatch() {
		for _, ms := range []map[string]*networkingapi.StringMatch{m.GetHeaders(), m.GetQueryParams()} {
			for _, sm := range ms {
				found = found || anyValue(sm)
			}
		}
	}
	if !found {
		return hr
	}
	out := proto.Clone(hr).(*networkingapi.HTTPRoute)
	for _, m := range out.GetMatch() {
		for _, ms := range []map[string]*networkingapi.StringMatch{m.GetHeaders(), m.GetQueryParams()} {
			for k, sm := range ms {
				if anyValue(sm) {
					ms[k] = &networkingapi.StringMatch{}
				}
			}
		}
	}
	return out
}

// usableVirtualServices are in as sidecars get them (usableVirtualService),
// without those refused whole.
func usableVirtualServices(in []*networkingv1.VirtualService) []*networkingv1.VirtualService {
	out := make([]*networkingv1.VirtualService, 0, len(in))
	for _, vs := range in {
		if u, _ := usableVirtualService(vs); u != nil {
			out = append(out, u)
		}
	}
	return out
}

// refusedRules are the DestinationRules of in that Istio's rules refuse.
func refusedRules(in []*networkingv1.DestinationRule) map[*networkingv1.DestinationRule]bool {
	out := map[*networkingv1.DestinationRule]bool{}
	for _, dr := range in {
		if validation.DestinationRule(dr.Namespace, &dr.Spec) != nil {
			out[dr] = true
		}
	}
	return out
}
