package ambient

import (
	"sort"

	"google.golang.org/protobuf/types/known/emptypb"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/controller/securitypolicy"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Names of the Authorizations that enforce PeerAuthentication. They hold
// "_", which no Kubernetes object name can, so they never clash with an
// AuthorizationPolicy.
const (
	StaticStrictPolicyName        = "istio_converted_static_strict"
	convertedPeerAuthPolicyPrefix = "converted_peer_authentication_"
)

// StaticStrictPolicy is the one policy that enforces STRICT mTLS
// (wire contract §1.8): in the root namespace, DENY to peers without an
// identity (not_principals: presence). It is selector-scoped: a workload
// lists it in Workload.authorization_policies when its effective mode is
// STRICT.
func StaticStrictPolicy(cfg Config) *security.Authorization {
	cfg = cfg.WithDefaults()
	return denyPlaintext(StaticStrictPolicyName, cfg.RootNamespace, &security.Match{})
}

// MTLSPolicyKey returns the Authorization a workload lists to enforce the
// mTLS mode p decides: its own policy's converted form when that sets
// port-level modes, else the static strict policy when its mode is
// STRICT, else "".
func MTLSPolicyKey(p securitypolicy.PeerAuthentications, cfg Config) string {
	cfg = cfg.WithDefaults()
	if w := p.Workload; w != nil && len(w.Spec.GetPortLevelMtls()) > 0 {
		if BuildPeerAuthentication(w, p.Inherited()) != nil {
			return w.Namespace + "/" + convertedPeerAuthPolicyPrefix + w.Name
		}
		return ""
	}
	if p.Mode() == securitypolicy.Strict {
		return cfg.RootNamespace + "/" + StaticStrictPolicyName
	}
	return ""
}

// workloadPolicies is Workload.authorization_policies: the sorted, unique
// keys of the AuthorizationPolicies that select the workload, then the key
// of its mTLS policy, as istiod lists them (buildWorkloadPolicies in
// pilot/pkg/serviceregistry/ambient/workloads.go).
func workloadPolicies(authz []string, mtls string) []string {
	out := sortedCopy(authz)
	if mtls != "" {
		out = append(out, mtls)
	}
	return out
}

// BuildPeerAuthentication converts a selector-bound PeerAuthentication with
// port-level modes into converted_peer_authentication_<name>
// (wire contract §1.8), a DENY to peers without an identity. inherited is
// the mode its namespace or the mesh gives; its own mode, when set, wins.
//
// Where the result is STRICT, the policy has one rule whose clauses must
// all match: a connection without an identity (when its own mode is
// STRICT), then, for each PERMISSIVE or DISABLE port, one clause "not to
// this port", then again a connection without an identity when the
// inherited mode is STRICT too (istiod lays it out so; the repeated clause
// changes nothing). Otherwise it has one rule per STRICT port: a
// connection without an identity to that port. Ports come in ascending
// order. It returns nil for any other policy, or when no port differs from
// the policy's mode: those act through StaticStrictPolicy and MTLSPolicyKey.
func BuildPeerAuthentication(pa *securityv1.PeerAuthentication, inherited securityapi.PeerAuthentication_MutualTLS_Mode) *security.Authorization {
	spec := &pa.Spec
	if spec.GetSelector() == nil || len(spec.GetPortLevelMtls()) == 0 {
		return nil
	}
	own := spec.GetMtls().GetMode()
	mode := own
	if mode == securityapi.PeerAuthentication_MutualTLS_UNSET {
		mode = inherited
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
	out := &security.Authorization{
		Name:      convertedPeerAuthPolicyPrefix + pa.Name,
		Namespace: pa.Namespace,
		Scope:     security.Scope_WORKLOAD_SELECTOR,
		Action:    security.Action_DENY,
	}
	if mode == securityapi.PeerAuthentication_MutualTLS_STRICT {
		if len(relaxedPorts) == 0 {
			return nil
		}
		var clauses []*security.Clause
		if own == securityapi.PeerAuthentication_MutualTLS_STRICT {
			clauses = append(clauses, noIdentity(&security.Match{}))
		}
		for _, port := range relaxedPorts {
			clauses = append(clauses, &security.Clause{Matches: []*security.Match{{NotDestinationPorts: []uint32{port}}}})
		}
		if inherited == securityapi.PeerAuthentication_MutualTLS_STRICT {
			clauses = append(clauses, noIdentity(&security.Match{}))
		}
		out.Rules = []*security.Rule{{Clauses: clauses}}
		return out
	}
	for _, port := range strictPorts {
		out.Rules = append(out.Rules, &security.Rule{Clauses: []*security.Clause{noIdentity(&security.Match{DestinationPorts: []uint32{port}})}})
	}
	if len(out.Rules) == 0 {
		return nil
	}
	return out
}

// noIdentity is a clause matching m for connections without a peer
// identity.
func noIdentity(m *security.Match) *security.Clause {
	m.NotPrincipals = []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}}
	return &security.Clause{Matches: []*security.Match{m}}
}

// denyPlaintext denies connections without a peer identity that match m,
// for the workloads that list it.
func denyPlaintext(name, namespace string, m *security.Match) *security.Authorization {
	return &security.Authorization{
		Name:      name,
		Namespace: namespace,
		Scope:     security.Scope_WORKLOAD_SELECTOR,
		Action:    security.Action_DENY,
		Rules:     []*security.Rule{{Clauses: []*security.Clause{noIdentity(m)}}},
	}
}

func sortPorts(p []uint32) { sort.Slice(p, func(i, j int) bool { return p[i] < p[j] }) }
