package ambient

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// ErrUnsupportedPolicy is wrapped when a policy cannot be sent to node
// proxies at all; the caller reports it in the policy's status.
var ErrUnsupportedPolicy = errors.New("policy not supported by node proxies")

// PolicyResult is a converted AuthorizationPolicy: the Authorization (nil
// when the policy is not for node proxies, e.g. one bound to a waypoint by
// targetRefs) and what was changed on the way, for the policy's status.
type PolicyResult struct {
	Authorization *security.Authorization
	Warnings      []string
}

// BuildAuthorization converts an AuthorizationPolicy (wire contract §1.8):
// scope from its selector and namespace (no selector in the root namespace is
// GLOBAL), from/to/when into clauses, wildcard strings into prefix, suffix or
// presence. Rules with HTTP attributes are dropped from ALLOW policies (the
// stricter choice) and reduced to their L4 part in DENY policies. A CUSTOM
// policy is a DENY policy of its rules (securitypolicy.CustomAsDeny), with a
// warning: istiod leaves it out of node proxies' tables, which lets
// through everything the policy was written to check. An AUDIT policy
// is an error with no Authorization (it never changes a decision). The
// dry-run annotation is read as istiod reads it (securitypolicy.DryRun).
// A value that does not parse is an error too, but the result then fails
// closed: an ALLOW policy with no rules (it allows nothing) or a DENY policy
// that denies everything, rather than no policy at all.
func BuildAuthorization(p *securityv1.AuthorizationPolicy, cfg Config) (PolicyResult, error) {
	cfg = cfg.WithDefaults()
	spec := &p.Spec
	if spec.GetTargetRef() != nil || len(spec.GetTargetRefs()) > 0 {
		return PolicyResult{}, nil
	}
	var res PolicyResult
	dryRun, err := securitypolicy.DryRun(p)
	if err != nil {
		res.Warnings = append(res.Warnings, err.Error())
	}
	out := &security.Authorization{
		Name:      p.Name,
		Namespace: p.Namespace,
		DryRun:    dryRun,
	}
	switch securitypolicy.EnforcedAction(p) {
	case securityapi.AuthorizationPolicy_ALLOW:
		out.Action = security.Action_ALLOW
	case securityapi.AuthorizationPolicy_DENY:
		out.Action = security.Action_DENY
	default:
		return PolicyResult{}, fmt.Errorf("%w: action %s", ErrUnsupportedPolicy, spec.GetAction())
	}
	if spec.GetAction() == securityapi.AuthorizationPolicy_CUSTOM {
		res.Warnings = append(res.Warnings, securitypolicy.CustomAsDeny)
	}
	switch {
	case spec.GetSelector() != nil:
		out.Scope = security.Scope_WORKLOAD_SELECTOR
	case p.Namespace == cfg.RootNamespace:
		out.Scope = security.Scope_GLOBAL
	default:
		out.Scope = security.Scope_NAMESPACE
	}

	for i, r := range spec.GetRules() {
		rule, httpOnly, err := convertRule(r, p.Namespace, out.Action)
		if err != nil {
			out.Rules = nil
			if out.Action == security.Action_DENY {
				out.Rules = []*security.Rule{{}} // an empty rule matches every connection
			}
			return PolicyResult{Authorization: out}, fmt.Errorf("rule %d: %w", i, err)
		}
		if len(httpOnly) > 0 {
			if out.Action == security.Action_ALLOW {
				res.Warnings = append(res.Warnings, fmt.Sprintf("rule %d dropped: node proxies cannot match %s", i, strings.Join(httpOnly, ", ")))
				continue
			}
			res.Warnings = append(res.Warnings, fmt.Sprintf("rule %d enforced on its L4 attributes only: node proxies cannot match %s", i, strings.Join(httpOnly, ", ")))
		}
		out.Rules = append(out.Rules, rule)
	}
	// An ALLOW policy whose every rule was dropped still exists, with no
	// rules: it matches nothing, so it denies what no other ALLOW allows.
	res.Authorization = out
	return res, nil
}

// convertRule turns one rule into clauses (AND), in the order istiod emits
// them (handleRule in pilot/pkg/serviceregistry/ambient/authorization.go):
// one for to (a Match per operation, OR), one for from (a Match per
// source), one per L4 condition.
// It also lists the HTTP-only attributes it could not keep. In a DENY rule,
// a source or operation left empty by that removal matched on HTTP alone:
// its clause is dropped, so the rule denies at L4 (node proxies skip empty
// Matches, which would otherwise make the clause match nothing).
func convertRule(r *securityapi.Rule, policyNamespace string, action security.Action) (*security.Rule, []string, error) {
	var httpOnly []string
	out := &security.Rule{}
	addClause := func(c *security.Clause) {
		if action == security.Action_DENY {
			for _, m := range c.Matches {
				if proto.Size(m) == 0 {
					return
				}
			}
		}
		out.Clauses = append(out.Clauses, c)
	}
	if len(r.GetTo()) > 0 {
		c := &security.Clause{}
		for _, t := range r.GetTo() {
			m, skipped, err := operationMatch(t.GetOperation())
			if err != nil {
				return nil, nil, fmt.Errorf("to: %w", err)
			}
			httpOnly = append(httpOnly, skipped...)
			c.Matches = append(c.Matches, m)
		}
		addClause(c)
	}
	if len(r.GetFrom()) > 0 {
		c := &security.Clause{}
		for _, f := range r.GetFrom() {
			m, skipped, err := sourceMatch(f.GetSource(), policyNamespace)
			if err != nil {
				return nil, nil, fmt.Errorf("from: %w", err)
			}
			httpOnly = append(httpOnly, skipped...)
			c.Matches = append(c.Matches, m)
		}
		addClause(c)
	}
	for _, cond := range r.GetWhen() {
		m, ok, err := conditionMatch(cond)
		if err != nil {
			return nil, nil, fmt.Errorf("when %s: %w", cond.GetKey(), err)
		}
		if !ok {
			httpOnly = append(httpOnly, "when "+cond.GetKey())
			continue
		}
		out.Clauses = append(out.Clauses, &security.Clause{Matches: []*security.Match{m}})
	}
	return out, dedupe(httpOnly), nil
}

func sourceMatch(s *securityapi.Source, policyNamespace string) (*security.Match, []string, error) {
	m := &security.Match{
		Namespaces:    stringMatches(s.GetNamespaces()),
		NotNamespaces: stringMatches(s.GetNotNamespaces()),
		Principals:    stringMatches(s.GetPrincipals()),
		NotPrincipals: stringMatches(s.GetNotPrincipals()),
	}
	var err error
	if m.SourceIps, err = addresses(s.GetIpBlocks()); err != nil {
		return nil, nil, err
	}
	if m.NotSourceIps, err = addresses(s.GetNotIpBlocks()); err != nil {
		return nil, nil, err
	}
	m.ServiceAccounts = serviceAccounts(s.GetServiceAccounts(), policyNamespace)
	m.NotServiceAccounts = serviceAccounts(s.GetNotServiceAccounts(), policyNamespace)
	var httpOnly []string
	for name, set := range map[string]bool{
		"requestPrincipals": len(s.GetRequestPrincipals())+len(s.GetNotRequestPrincipals()) > 0,
		"remoteIpBlocks":    len(s.GetRemoteIpBlocks())+len(s.GetNotRemoteIpBlocks()) > 0,
		"trustDomains":      len(s.GetTrustDomains())+len(s.GetNotTrustDomains()) > 0,
	} {
		if set {
			httpOnly = append(httpOnly, "from."+name)
		}
	}
	return m, httpOnly, nil
}

func operationMatch(o *securityapi.Operation) (*security.Match, []string, error) {
	m := &security.Match{}
	var err error
	if m.DestinationPorts, err = ports(o.GetPorts()); err != nil {
		return nil, nil, err
	}
	if m.NotDestinationPorts, err = ports(o.GetNotPorts()); err != nil {
		return nil, nil, err
	}
	var httpOnly []string
	for name, set := range map[string]bool{
		"hosts":   len(o.GetHosts())+len(o.GetNotHosts()) > 0,
		"methods": len(o.GetMethods())+len(o.GetNotMethods()) > 0,
		"paths":   len(o.GetPaths())+len(o.GetNotPaths()) > 0,
	} {
		if set {
			httpOnly = append(httpOnly, "to."+name)
		}
	}
	return m, httpOnly, nil
}

// conditionMatch converts a when condition on an L4 key; ok is false for
// other keys (request headers, JWT claims...).
func conditionMatch(c *securityapi.Condition) (*security.Match, bool, error) {
	m := &security.Match{}
	var err error
	switch c.GetKey() {
	case "source.ip":
		if m.SourceIps, err = addresses(c.GetValues()); err == nil {
			m.NotSourceIps, err = addresses(c.GetNotValues())
		}
	case "source.namespace":
		m.Namespaces, m.NotNamespaces = stringMatches(c.GetValues()), stringMatches(c.GetNotValues())
	case "source.principal":
		m.Principals, m.NotPrincipals = stringMatches(c.GetValues()), stringMatches(c.GetNotValues())
	case "destination.ip":
		if m.DestinationIps, err = addresses(c.GetValues()); err == nil {
			m.NotDestinationIps, err = addresses(c.GetNotValues())
		}
	case "destination.port":
		if m.DestinationPorts, err = ports(c.GetValues()); err == nil {
			m.NotDestinationPorts, err = ports(c.GetNotValues())
		}
	default:
		return nil, false, nil
	}
	return m, err == nil, err
}

// stringMatch turns a policy string into a match: "*" is presence, "*x" a
// suffix, "x*" a prefix, anything else exact.
func stringMatch(v string) *security.StringMatch {
	switch {
	case v == "*":
		return &security.StringMatch{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}
	case strings.HasPrefix(v, "*"):
		return &security.StringMatch{MatchType: &security.StringMatch_Suffix{Suffix: v[1:]}}
	case strings.HasSuffix(v, "*"):
		return &security.StringMatch{MatchType: &security.StringMatch_Prefix{Prefix: v[:len(v)-1]}}
	default:
		return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: v}}
	}
}

func stringMatches(vs []string) []*security.StringMatch {
	var out []*security.StringMatch
	for _, v := range vs {
		out = append(out, stringMatch(v))
	}
	return out
}

// addresses parses IPs and CIDRs; a single IP gets a full-length prefix.
func addresses(vs []string) ([]*security.Address, error) {
	var out []*security.Address
	for _, v := range vs {
		var p netip.Prefix
		if strings.Contains(v, "/") {
			var err error
			if p, err = netip.ParsePrefix(v); err != nil {
				return nil, fmt.Errorf("%w: ip block %q: %w", ErrUnsupportedPolicy, v, err)
			}
		} else {
			a, err := netip.ParseAddr(v)
			if err != nil {
				return nil, fmt.Errorf("%w: ip %q: %w", ErrUnsupportedPolicy, v, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, &security.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())})
	}
	return out, nil
}

func ports(vs []string) ([]uint32, error) {
	var out []uint32
	for _, v := range vs {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%w: port %q is not a port number", ErrUnsupportedPolicy, v)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// serviceAccounts parses "namespace/name", or "name" in the policy's
// namespace.
func serviceAccounts(vs []string, policyNamespace string) []*security.ServiceAccountMatch {
	var out []*security.ServiceAccountMatch
	for _, v := range vs {
		ns, name, ok := strings.Cut(v, "/")
		if !ok {
			ns, name = policyNamespace, v
		}
		out = append(out, &security.ServiceAccountMatch{Namespace: ns, ServiceAccount: name})
	}
	return out
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
