package validation

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
)

// Annotations Istio reads on configuration objects.
const (
	// AnnotationDryRun makes an AuthorizationPolicy evaluated and logged,
	// not enforced; other kinds may not carry it.
	AnnotationDryRun = "istio.io/dry-run"
	// AnnotationAlwaysReject makes the webhook refuse the object: the
	// controller probes with it whether the webhook answers (Istio's
	// "internal.istio.io/webhook-always-reject").
	AnnotationAlwaysReject = "internal.istio.io/webhook-always-reject"
)

// internalAnnotations are set by istiod on configuration it generates and
// raise what the object may do; users may not set them.
var internalAnnotations = []string{"internal.istio.io/parent-namespace", "internal.istio.io/parents"}

// Annotations checks the annotations of an object of kind (Istio's kind
// name) as Istio's webhook does for every kind: no dry-run annotation but
// on an AuthorizationPolicy (whose value AuthorizationPolicy checks), no
// internal annotation, and the always-reject annotation refused.
func Annotations(kind, namespace, name string, annotations map[string]string) error {
	if _, ok := annotations[AnnotationDryRun]; ok && kind != "AuthorizationPolicy" {
		return fmt.Errorf("%s/%s has unsupported annotation %s, please remove the annotation", namespace, name, AnnotationDryRun)
	}
	if _, ok := annotations[AnnotationAlwaysReject]; ok {
		return fmt.Errorf("%q annotation found, rejecting", AnnotationAlwaysReject)
	}
	for _, a := range internalAnnotations {
		if _, ok := annotations[a]; ok {
			return fmt.Errorf("%q annotation found, this may not be set by users", a)
		}
	}
	return nil
}

// PeerAuthentication checks a PeerAuthentication as Istio's webhook does.
func PeerAuthentication(pa *securityapi.PeerAuthentication) error {
	var out errs
	if len(pa.GetSelector().GetMatchLabels()) == 0 && len(pa.GetPortLevelMtls()) != 0 {
		out.addf("mesh/namespace peer authentication cannot have port level mTLS")
	}
	if pa.GetPortLevelMtls() != nil && len(pa.GetPortLevelMtls()) == 0 {
		out.addf("port level mTLS, if defined, must have at least one element")
	}
	for port := range pa.GetPortLevelMtls() {
		if port == 0 || port > 65535 {
			out.addf("port must be in range 1..65535")
		}
	}
	out.add(selector(pa.GetSelector()))
	return out.err()
}

func selector(s *typeapi.WorkloadSelector) error {
	if s == nil {
		return nil
	}
	return selectorLabels(s.GetMatchLabels())
}

// AuthorizationPolicy checks an AuthorizationPolicy named namespace/name
// with annotations as Istio's webhook does; each problem is prefixed
// "invalid policy <name>.<namespace>:" as Istio's are.
func AuthorizationPolicy(namespace, name string, annotations map[string]string, ap *securityapi.AuthorizationPolicy) error {
	var out errs
	if v, ok := annotations[AnnotationDryRun]; ok {
		switch ap.GetAction() {
		case securityapi.AuthorizationPolicy_ALLOW, securityapi.AuthorizationPolicy_DENY:
			if _, err := strconv.ParseBool(v); err != nil {
				return fmt.Errorf("%s/%s has annotation %s with invalid value (%s): %w", namespace, name, AnnotationDryRun, v, err)
			}
		default:
			return fmt.Errorf("the annotation %s currently only supports action ALLOW/DENY, found action %v in %s/%s",
				AnnotationDryRun, ap.GetAction(), namespace, name)
		}
	}
	set := 0
	for _, b := range []bool{ap.GetSelector() != nil, ap.GetTargetRef() != nil, len(ap.GetTargetRefs()) > 0} {
		if b {
			set++
		}
	}
	if set > 1 {
		out.addf("only one of targetRefs or workloadSelector can be set")
	}
	out.add(selector(ap.GetSelector()), targetRef(ap.GetTargetRef()))
	for _, r := range ap.GetTargetRefs() {
		out.add(targetRef(r))
	}

	if ap.GetAction() == securityapi.AuthorizationPolicy_CUSTOM {
		if ap.GetRules() == nil {
			out.addf("CUSTOM action without `rules` is meaningless as it will never be triggered, " +
				"add an empty rule `{}` if you want it be triggered for every request")
		} else if ap.GetProvider().GetName() == "" {
			out.addf("`provider.name` must not be empty")
		}
		for _, r := range ap.GetRules() {
			out.add(customRule(r))
		}
	}
	if ap.GetProvider() != nil && ap.GetAction() != securityapi.AuthorizationPolicy_CUSTOM {
		out.addf("`provider` must not be with non CUSTOM action, found %s", ap.GetAction())
	}
	if ap.GetAction() == securityapi.AuthorizationPolicy_DENY && ap.GetRules() == nil {
		out.addf("DENY action without `rules` is meaningless as it will never be triggered, " +
			"add an empty rule `{}` if you want it be triggered for every request")
	}
	for i, r := range ap.GetRules() {
		out.add(rule(i, r))
	}
	return prefixed(out.err(), fmt.Sprintf("invalid policy %s.%s:", name, namespace))
}

// targetKinds are the kinds a policy may target, by group ("core" for the
// core group).
var targetKinds = map[string]string{"Service": "core", "ServiceEntry": "networking.istio.io", "Gateway": "gateway.networking.k8s.io", "GatewayClass": "gateway.networking.k8s.io"}

func targetRef(r *typeapi.PolicyTargetReference) error {
	if r == nil {
		return nil
	}
	var out errs
	if r.GetName() == "" {
		out.addf("targetRef name must be set")
	}
	if r.GetNamespace() != "" {
		out.addf("targetRef namespace must not be set; cross namespace referencing is not supported")
	}
	group := r.GetGroup()
	if group == "" {
		group = "core"
	}
	if g, ok := targetKinds[r.GetKind()]; !ok || g != group {
		out.addf("targetRef must be to one of Service, ServiceEntry, Gateway or GatewayClass but was %s/%s", r.GetGroup(), r.GetKind())
	}
	return out.err()
}

// customRule: a CUSTOM action's external authorizer cannot see identities.
func customRule(r *securityapi.Rule) error {
	var out errs
	unsupported := func(bad bool, what string) {
		if bad {
			out.addf("%s is currently not supported with CUSTOM action", what)
		}
	}
	for _, f := range r.GetFrom() {
		if s := f.GetSource(); s != nil {
			unsupported(len(s.GetNamespaces()) != 0, "From.Namespaces")
			unsupported(len(s.GetNotNamespaces()) != 0, "From.NotNamespaces")
			unsupported(len(s.GetServiceAccounts()) != 0, "From.ServiceAccounts")
			unsupported(len(s.GetNotServiceAccounts()) != 0, "From.NotServiceAccounts")
			unsupported(len(s.GetTrustDomains()) != 0, "From.TrustDomains")
			unsupported(len(s.GetNotTrustDomains()) != 0, "From.NotTrustDomains")
			unsupported(len(s.GetPrincipals()) != 0, "From.Principals")
			unsupported(len(s.GetNotPrincipals()) != 0, "From.NotPrincipals")
			unsupported(len(s.GetRequestPrincipals()) != 0, "From.RequestPrincipals")
			unsupported(len(s.GetNotRequestPrincipals()) != 0, "From.NotRequestPrincipals")
		}
	}
	for _, w := range r.GetWhen() {
		if w == nil {
			out.addf("when field cannot be nil")
			continue
		}
		k := w.GetKey()
		unsupported(k == "source.namespace" || k == "source.serviceAccount" || k == "source.trustDomain" ||
			k == "source.principal" || strings.HasPrefix(k, "request.auth."), k)
	}
	return out.err()
}

func rule(i int, r *securityapi.Rule) error {
	if r == nil {
		return fmt.Errorf("`rule` must not be nil, found at rule %d", i)
	}
	var out errs
	if r.From != nil && len(r.GetFrom()) == 0 {
		out.addf("`from` must not be empty, found at rule %d", i)
	}
	for _, f := range r.GetFrom() {
		if f == nil {
			out.addf("`from` must not be nil, found at rule %d", i)
			continue
		}
		if f.GetSource() == nil {
			out.addf("`from.source` must not be nil, found at rule %d", i)
			continue
		}
		out.add(source(i, f.GetSource()))
	}
	if r.To != nil && len(r.GetTo()) == 0 {
		out.addf("`to` must not be empty, found at rule %d", i)
	}
	for _, t := range r.GetTo() {
		if t == nil {
			out.addf("`to` must not be nil, found at rule %d", i)
			continue
		}
		if t.GetOperation() == nil {
			out.addf("`to.operation` must not be nil, found at rule %d", i)
			continue
		}
		out.add(operation(i, t.GetOperation()))
	}
	for _, c := range r.GetWhen() {
		k := c.GetKey()
		switch {
		case k == "":
			out.addf("`key` must not be empty")
		case len(c.GetValues()) == 0 && len(c.GetNotValues()) == 0:
			out.addf("at least one of `values` or `notValues` must be set for key %s", k)
		default:
			if err := attribute(k, c.GetValues()); err != nil {
				out.addf("invalid `value` for `key` %s: %w", k, err)
			}
			if err := attribute(k, c.GetNotValues()); err != nil {
				out.addf("invalid `notValue` for `key` %s: %w", k, err)
			}
		}
	}
	return out.err()
}

func source(i int, s *securityapi.Source) error {
	var out errs
	if len(s.GetPrincipals())+len(s.GetNotPrincipals())+len(s.GetNamespaces())+len(s.GetNotNamespaces()) > 0 &&
		len(s.GetServiceAccounts())+len(s.GetNotServiceAccounts()) > 0 {
		out.addf("cannot set serviceAccounts with namespaces or principals, found at rule %d", i)
	}
	fields := [][]string{s.GetPrincipals(), s.GetRequestPrincipals(), s.GetNamespaces(), s.GetIpBlocks(), s.GetRemoteIpBlocks(),
		s.GetNotPrincipals(), s.GetNotRequestPrincipals(), s.GetNotNamespaces(), s.GetNotIpBlocks(), s.GetNotRemoteIpBlocks(),
		s.GetServiceAccounts(), s.GetNotServiceAccounts(), s.GetTrustDomains(), s.GetNotTrustDomains()}
	empty := true
	for _, f := range fields {
		empty = empty && len(f) == 0
	}
	if empty {
		out.addf("`from.source` must not be empty, found at rule %d", i)
	}
	out.add(ips(s.GetIpBlocks()), ips(s.GetNotIpBlocks()), ips(s.GetRemoteIpBlocks()), ips(s.GetNotRemoteIpBlocks()))
	out.add(nonEmpty("Principals", s.GetPrincipals()), nonEmpty("RequestPrincipals", s.GetRequestPrincipals()),
		nonEmpty("Namespaces", s.GetNamespaces()), serviceAccounts("ServiceAccounts", s.GetServiceAccounts()),
		trustDomains("TrustDomains", s.GetTrustDomains()), nonEmpty("IpBlocks", s.GetIpBlocks()),
		nonEmpty("RemoteIpBlocks", s.GetRemoteIpBlocks()), nonEmpty("NotPrincipals", s.GetNotPrincipals()),
		nonEmpty("NotRequestPrincipals", s.GetNotRequestPrincipals()), nonEmpty("NotNamespaces", s.GetNotNamespaces()),
		serviceAccounts("NotServiceAccounts", s.GetNotServiceAccounts()), trustDomains("NotTrustDomains", s.GetNotTrustDomains()),
		nonEmpty("NotIpBlocks", s.GetNotIpBlocks()), nonEmpty("NotRemoteIpBlocks", s.GetNotRemoteIpBlocks()))
	return out.err()
}

func operation(i int, op *securityapi.Operation) error {
	var out errs
	if len(op.GetPorts())+len(op.GetMethods())+len(op.GetPaths())+len(op.GetHosts())+
		len(op.GetNotPorts())+len(op.GetNotMethods())+len(op.GetNotPaths())+len(op.GetNotHosts()) == 0 {
		out.addf("`to.operation` must not be empty, found at rule %d", i)
	}
	out.add(ports(op.GetPorts()), ports(op.GetNotPorts()))
	out.add(nonEmpty("Ports", op.GetPorts()), nonEmpty("Methods", op.GetMethods()), nonEmpty("Paths", op.GetPaths()),
		nonEmpty("Hosts", op.GetHosts()), nonEmpty("NotPorts", op.GetNotPorts()), nonEmpty("NotMethods", op.GetNotMethods()),
		nonEmpty("NotPaths", op.GetNotPaths()), nonEmpty("NotHosts", op.GetNotHosts()))
	out.add(pathTemplates("Paths", op.GetPaths()), pathTemplates("NotPaths", op.GetNotPaths()))
	return out.err()
}

func nonEmpty(key string, values []string) error {
	for _, v := range values {
		if v == "" {
			return fmt.Errorf("empty value not allowed, found in %s", key)
		}
	}
	return nil
}

func ips(values []string) error {
	var out errs
	for _, v := range values {
		if strings.Contains(v, "/") {
			if _, err := netip.ParsePrefix(v); err != nil {
				out.addf("bad CIDR range (%s): %w", v, err)
			}
		} else if _, err := netip.ParseAddr(v); err != nil {
			out.addf("bad IP address (%s)", v)
		}
	}
	return out.err()
}

func ports(values []string) error {
	var out errs
	for _, v := range values {
		if p, err := strconv.ParseUint(v, 10, 32); err != nil || p > 65535 {
			out.addf("bad port (%s)", v)
		}
	}
	return out.err()
}

// maxServiceAccounts bounds a policy's service account lists, as Istio
// does, so that configurations stay small.
const maxServiceAccounts = 16

func serviceAccounts(key string, values []string) error {
	if len(values) > maxServiceAccounts {
		return fmt.Errorf("may not have more than %d values", maxServiceAccounts)
	}
	for _, v := range values {
		switch {
		case v == "":
			return fmt.Errorf("empty value not allowed, found in %s", key)
		case strings.Contains(v, "*"):
			return fmt.Errorf("wildcard not allowed, found in %s", key)
		case strings.Count(v, "/") > 1:
			return fmt.Errorf("expected format 'serviceAccount' or 'namespace/serviceAccount', found %q in %s", v, key)
		case len(v) > 320:
			return fmt.Errorf("value cannot exceed 320 characters, found %q in %s", v, key)
		}
		if ns, sa, ok := strings.Cut(v, "/"); ok && ns == "" {
			return fmt.Errorf("expected format 'serviceAccount' or 'namespace/serviceAccount', found empty namespace %q in %s", v, key)
		} else if ok && sa == "" {
			return fmt.Errorf("expected format 'serviceAccount' or 'namespace/serviceAccount', found empty serviceAccount %q in %s", v, key)
		}
	}
	return nil
}

// wildcardValues: at most one '*', at the start or the end.
func wildcardValues(key string, values []string) error {
	if err := nonEmpty(key, values); err != nil {
		return err
	}
	for _, v := range values {
		n := strings.Count(v, "*")
		if n > 1 {
			return fmt.Errorf("at most one wildcard is allowed, found in %s: %q", key, v)
		}
		if n == 1 && v != "*" && !strings.HasPrefix(v, "*") && !strings.HasSuffix(v, "*") {
			return fmt.Errorf("wildcard is only allowed at the start or end, found in %s: %q", key, v)
		}
	}
	return nil
}

func trustDomains(key string, values []string) error {
	if err := wildcardValues(key, values); err != nil {
		return err
	}
	for _, v := range values {
		if strings.Contains(v, "/") {
			return fmt.Errorf("trust domain must not contain '/', found in %s: %q", key, v)
		}
	}
	return nil
}

// Path templates Envoy's URI template matcher takes.
const (
	matchOneTemplate = "{*}"
	matchAnyTemplate = "{**}"
)

var pathLiteral = regexp.MustCompile(`^[a-zA-Z0-9-._~%!$&'()+,;:@=]+$`)

// pathTemplates: "{*}" and "{**}" as whole segments, "{**}" last, literal
// segments of URI characters.
func pathTemplates(key string, paths []string) error {
	for _, p := range paths {
		template := strings.Contains(p, matchOneTemplate) || strings.Contains(p, matchAnyTemplate)
		p = strings.Trim(p, "/")
		anySeen := false
		for _, glob := range strings.Split(p, "/") {
			switch {
			case glob == matchOneTemplate && !anySeen:
				continue
			case glob == matchAnyTemplate && !anySeen:
				anySeen = true
				continue
			case (glob == matchAnyTemplate || glob == matchOneTemplate) && anySeen:
				return fmt.Errorf("invalid or unsupported path %s, found in %s. {**} is not the last operator", p, key)
			case strings.ContainsAny(glob, "{}"):
				return fmt.Errorf("invalid or unsupported path %s, found in %s. Contains '{' or '}' beyond a supported path template", p, key)
			case template && !pathLiteral.MatchString(glob):
				return fmt.Errorf("invalid or unsupported path %s, found in %s. Contains segment %s with invalid string literal", p, key, glob)
			}
		}
	}
	return nil
}

// attribute checks a condition's key and values.
func attribute(key string, values []string) error {
	if err := nonEmpty(key, values); err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(key, "request.headers"), strings.HasPrefix(key, "request.auth.claims"),
		strings.HasPrefix(key, "experimental.envoy.filters."):
		return mapKey(key)
	case key == "source.ip", key == "remote.ip", key == "destination.ip":
		return ips(values)
	case key == "destination.port":
		return ports(values)
	case key == "source.serviceAccount":
		return serviceAccounts(key, values)
	case key == "source.trustDomain":
		return wildcardValues(key, values)
	case key == "source.namespace", key == "source.principal", key == "request.auth.principal",
		key == "request.auth.audiences", key == "request.auth.presenter", key == "connection.sni":
		return nil
	case key == "destination.namespace":
		return fmt.Errorf("attribute %s is replaced by the metadata.namespace", key)
	case strings.HasPrefix(key, "destination.labels"):
		return fmt.Errorf("attribute %s is replaced by the workload selector", key)
	case key == "destination.name", key == "destination.user":
		return fmt.Errorf("deprecated attribute %s: only supported in v1alpha1", key)
	}
	return fmt.Errorf("unknown attribute: %s", key)
}

// mapKey: "a[b]".
func mapKey(key string) error {
	open := strings.Index(key, "[")
	if strings.HasSuffix(key, "]") && open > 0 && open < len(key)-2 {
		return nil
	}
	return errors.New("bad key (" + key + "): should have format a[b]")
}
