// Package authz decides whether a connection to a workload is allowed by the
// L4 authorization policies it is subject to (docs/wire-contract.md §1.8):
// DENY policies first, then allow when no ALLOW policy applies, else allow
// only when one matches. Pure: policies and a connection in, a decision out.
package authz

import (
	"net/netip"
	"strings"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Conn is what a policy can see of a connection.
type Conn struct {
	Src, Dst netip.Addr
	DstPort  uint16
	// Peer is the client's verified identity; nil for plaintext.
	Peer *workloadapi.Identity
}

// Decision is the outcome, with the policy that decided it (empty when
// no policy applied) and the dry-run policies that would have matched.
type Decision struct {
	Allow  bool
	Policy string
	// Reason is "denied by", "allowed by", "no allow policy" or "no allow
	// policy matched".
	Reason string
	DryRun []string
}

// Applicable returns the policies a workload is subject to: every GLOBAL
// policy, the NAMESPACE policies of its namespace, and the policies its
// Workload lists (selector policies).
func Applicable(all []*security.Authorization, w *workloadapi.Workload) []*security.Authorization {
	listed := map[string]bool{}
	for _, k := range w.GetAuthorizationPolicies() {
		listed[k] = true
	}
	var out []*security.Authorization
	for _, p := range all {
		switch {
		case p.GetScope() == security.Scope_GLOBAL,
			p.GetScope() == security.Scope_NAMESPACE && p.GetNamespace() == w.GetNamespace(),
			listed[security.ResourceName(p)]:
			out = append(out, p)
		}
	}
	return out
}

// Evaluate decides c against policies (wire contract §1.8).
func Evaluate(policies []*security.Authorization, c Conn) Decision {
	var d Decision
	enforcedAllow := false
	var allowMatch string
	for _, p := range policies {
		matched := matches(p, c)
		if p.GetDryRun() {
			if matched {
				d.DryRun = append(d.DryRun, security.ResourceName(p))
			}
			continue
		}
		switch p.GetAction() {
		case security.Action_DENY:
			if matched && d.Policy == "" {
				d.Policy, d.Reason = security.ResourceName(p), "denied by"
			}
		case security.Action_ALLOW:
			enforcedAllow = true
			if matched && allowMatch == "" {
				allowMatch = security.ResourceName(p)
			}
		}
	}
	switch {
	case d.Policy != "":
		d.Allow = false
	case !enforcedAllow:
		d.Allow, d.Reason = true, "no allow policy"
	case allowMatch != "":
		d.Allow, d.Policy, d.Reason = true, allowMatch, "allowed by"
	default:
		d.Allow, d.Reason = false, "no allow policy matched"
	}
	return d
}

// matches: rules are OR-ed; a policy without rules never matches.
func matches(p *security.Authorization, c Conn) bool {
	for _, r := range p.GetRules() {
		if ruleMatches(r, c) {
			return true
		}
	}
	return false
}

// ruleMatches: clauses are AND-ed. An empty clause matches; in a
// non-empty one some non-empty Match must match.
func ruleMatches(r *security.Rule, c Conn) bool {
	for _, cl := range r.GetClauses() {
		ok := len(cl.GetMatches()) == 0
		for _, m := range cl.GetMatches() {
			if !isEmpty(m) && matchMatches(m, c) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func isEmpty(m *security.Match) bool {
	return len(m.GetNamespaces())+len(m.GetNotNamespaces())+len(m.GetPrincipals())+len(m.GetNotPrincipals())+
		len(m.GetSourceIps())+len(m.GetNotSourceIps())+len(m.GetDestinationIps())+len(m.GetNotDestinationIps())+
		len(m.GetDestinationPorts())+len(m.GetNotDestinationPorts())+len(m.GetServiceAccounts())+len(m.GetNotServiceAccounts()) == 0
}

// matchMatches: every attribute present must hold; values of one
// attribute are OR-ed; not_ lists must match none.
func matchMatches(m *security.Match, c Conn) bool {
	var ns, principal, sa string
	if c.Peer != nil {
		ns, principal, sa = c.Peer.Namespace, c.Peer.Principal(), c.Peer.ServiceAccount
	}
	hasPeer := c.Peer != nil
	strs := func(pos, neg []*security.StringMatch, v string) bool {
		return (len(pos) == 0 || (hasPeer && anyString(pos, v))) && !(hasPeer && anyString(neg, v))
	}
	if !strs(m.GetNamespaces(), m.GetNotNamespaces(), ns) || !strs(m.GetPrincipals(), m.GetNotPrincipals(), principal) {
		return false
	}
	if !addrs(m.GetSourceIps(), m.GetNotSourceIps(), c.Src) || !addrs(m.GetDestinationIps(), m.GetNotDestinationIps(), c.Dst) {
		return false
	}
	if (len(m.GetDestinationPorts()) > 0 && !hasPort(m.GetDestinationPorts(), c.DstPort)) || hasPort(m.GetNotDestinationPorts(), c.DstPort) {
		return false
	}
	if len(m.GetServiceAccounts()) > 0 && !(hasPeer && anyAccount(m.GetServiceAccounts(), ns, sa)) {
		return false
	}
	return !(hasPeer && anyAccount(m.GetNotServiceAccounts(), ns, sa))
}

func anyString(ms []*security.StringMatch, v string) bool {
	for _, m := range ms {
		if stringMatches(m, v) {
			return true
		}
	}
	return false
}

func stringMatches(m *security.StringMatch, v string) bool {
	switch t := m.GetMatchType().(type) {
	case *security.StringMatch_Exact:
		return v == t.Exact
	case *security.StringMatch_Prefix:
		return strings.HasPrefix(v, t.Prefix)
	case *security.StringMatch_Suffix:
		return strings.HasSuffix(v, t.Suffix)
	case *security.StringMatch_Presence:
		return v != ""
	}
	return false
}

func addrs(pos, neg []*security.Address, ip netip.Addr) bool {
	return (len(pos) == 0 || anyAddr(pos, ip)) && !anyAddr(neg, ip)
}

func anyAddr(as []*security.Address, ip netip.Addr) bool {
	for _, a := range as {
		base, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			continue // malformed: matches nothing
		}
		p, err := base.Prefix(int(a.GetLength()))
		if err != nil {
			continue
		}
		if p.Contains(ip.Unmap()) || p.Contains(ip) {
			return true
		}
	}
	return false
}

func hasPort(ports []uint32, p uint16) bool {
	for _, x := range ports {
		if x == uint32(p) {
			return true
		}
	}
	return false
}

func anyAccount(ms []*security.ServiceAccountMatch, ns, sa string) bool {
	for _, m := range ms {
		if m.GetNamespace() == ns && m.GetServiceAccount() == sa {
			return true
		}
	}
	return false
}
