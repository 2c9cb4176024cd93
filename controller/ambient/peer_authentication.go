package ambient

import (
	"sort"

	"google.golang.org/protobuf/types/known/emptypb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Names of the Authorizations that enforce PeerAuthentication. They hold
// "_", which no Kubernetes object name can, so they never clash with an
// AuthorizationPolicy.
const (
	StaticStrictPolicyName        = "istio_converted_static_strict"
	convertedPeerAuthPolicyPrefix = "converted_peer_authentication_"
)

// BuildPeerAuthentication converts a PeerAuthentication into the DENY
// policy that enforces it on node proxies: deny connections without a peer
// identity (not_principals: presence). A STRICT policy without a selector is
// the static policy of its namespace, GLOBAL in the root namespace; one with
// a selector becomes converted_peer_authentication_<name>, limited to its
// STRICT ports when port-level modes differ. It returns nil when nothing is
// enforced (PERMISSIVE, DISABLE, UNSET).
//
// Not modelled: a namespace's PERMISSIVE does not relax a mesh-wide STRICT.
func BuildPeerAuthentication(pa *securityv1.PeerAuthentication, cfg Config) *security.Authorization {
	cfg = cfg.WithDefaults()
	spec := &pa.Spec
	strict := spec.GetMtls().GetMode() == securityapi.PeerAuthentication_MutualTLS_STRICT
	if spec.GetSelector() == nil {
		if !strict {
			return nil
		}
		scope := security.Scope_NAMESPACE
		if pa.Namespace == cfg.RootNamespace {
			scope = security.Scope_GLOBAL
		}
		return denyPlaintext(StaticStrictPolicyName, pa.Namespace, scope, &security.Match{})
	}

	var strictPorts, relaxedPorts []uint32
	for port, m := range spec.GetPortLevelMtls() {
		switch m.GetMode() {
		case securityapi.PeerAuthentication_MutualTLS_STRICT:
			strictPorts = append(strictPorts, port)
		case securityapi.PeerAuthentication_MutualTLS_PERMISSIVE, securityapi.PeerAuthentication_MutualTLS_DISABLE:
			relaxedPorts = append(relaxedPorts, port)
		}
	}
	sortPorts(strictPorts)
	sortPorts(relaxedPorts)
	match := &security.Match{}
	switch {
	case strict:
		match.NotDestinationPorts = relaxedPorts
	case len(strictPorts) > 0:
		match.DestinationPorts = strictPorts
	default:
		return nil
	}
	return denyPlaintext(convertedPeerAuthPolicyPrefix+pa.Name, pa.Namespace, security.Scope_WORKLOAD_SELECTOR, match)
}

// denyPlaintext denies connections without a peer identity that match m.
func denyPlaintext(name, namespace string, scope security.Scope, m *security.Match) *security.Authorization {
	m.NotPrincipals = []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}}
	return &security.Authorization{
		Name:      name,
		Namespace: namespace,
		Scope:     scope,
		Action:    security.Action_DENY,
		Rules:     []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{m}}}}},
	}
}

func sortPorts(p []uint32) { sort.Slice(p, func(i, j int) bool { return p[i] < p[j] }) }
