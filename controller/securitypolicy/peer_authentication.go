package securitypolicy

import (
	"iter"

	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
)

// Mode is a PeerAuthentication's mTLS mode.
type Mode = securityapi.PeerAuthentication_MutualTLS_Mode

// The modes, under shorter names.
const (
	Unset      = securityapi.PeerAuthentication_MutualTLS_UNSET
	Disable    = securityapi.PeerAuthentication_MutualTLS_DISABLE
	Permissive = securityapi.PeerAuthentication_MutualTLS_PERMISSIVE
	Strict     = securityapi.PeerAuthentication_MutualTLS_STRICT
)

// EmptySelector says how a PeerAuthentication whose selector has no
// labels (`selector: {}`) is read. istiod reads it one way for sidecars
// and the other for ztunnel; Canopy mirrors each path.
type EmptySelector int

const (
	// EmptySelectorNamespaceWide reads it as a policy without a selector:
	// its namespace's (or, in the root namespace, the mesh's), competing
	// with the others of that level by age. istiod does so for sidecars
	// (ComposePeerAuthentication in pilot/pkg/model/authentication.go).
	EmptySelectorNamespaceWide EmptySelector = iota
	// EmptySelectorSelectsAll reads it as a workload policy that selects
	// every workload of its namespace, and so outranks the namespace's
	// policy. istiod does so for ztunnel (its ambient index keys
	// namespace-wide policies on a nil selector only:
	// pilot/pkg/serviceregistry/ambient/policies.go).
	EmptySelectorSelectsAll
)

// PeerAuthentications are what decides one workload's mTLS mode: the
// workload policy that selects it (in its namespace), its namespace's
// policy and the mesh's (in the root namespace). Any may be nil.
type PeerAuthentications struct {
	Workload, Namespace, Mesh *securityv1.PeerAuthentication
}

// Mode is the effective mTLS mode: the workload's policy, else the
// namespace's, else the mesh's, each only if it sets a mode (UNSET
// inherits); PERMISSIVE by default.
func (p PeerAuthentications) Mode() Mode {
	for _, pa := range []*securityv1.PeerAuthentication{p.Workload, p.Namespace, p.Mesh} {
		if m := mode(pa); m != Unset {
			return m
		}
	}
	return Permissive
}

// PortMode is the mode for connections to the workload's target port
// port: the workload policy's port-level mode for it, when set, else Mode.
func (p PeerAuthentications) PortMode(port uint32) Mode {
	if p.Workload != nil {
		if pm, ok := p.Workload.Spec.GetPortLevelMtls()[port]; ok && pm.GetMode() != Unset {
			return pm.GetMode()
		}
	}
	return p.Mode()
}

// Inherited is the mode a workload policy whose own mode is UNSET takes:
// the namespace's, else the mesh's.
func (p PeerAuthentications) Inherited() Mode {
	return PeerAuthentications{Namespace: p.Namespace, Mesh: p.Mesh}.Mode()
}

func mode(pa *securityv1.PeerAuthentication) Mode {
	if pa == nil {
		return Unset
	}
	return pa.Spec.GetMtls().GetMode()
}

// WorkloadBound reports whether a PeerAuthentication is a workload policy
// (it selects workloads by labels) rather than its namespace's or the
// mesh's, reading an empty selector as empty says.
func WorkloadBound(pa *securityv1.PeerAuthentication, empty EmptySelector) bool {
	sel := pa.Spec.GetSelector()
	if sel == nil {
		return false
	}
	return len(sel.GetMatchLabels()) > 0 || empty == EmptySelectorSelectsAll
}

// PeerAuthSelects reports whether a workload policy selects a workload
// with labels lbls (its namespace aside).
func PeerAuthSelects(pa *securityv1.PeerAuthentication, lbls map[string]string) bool {
	return matchLabels(pa.Spec.GetSelector().GetMatchLabels(), lbls)
}

// Decide picks, of policies (any namespaces; others than ns and the root
// namespace are ignored), those that decide for a workload of namespace ns
// with labels lbls; nil labels ask for the namespace's own mode, without a
// workload policy. Of several candidates for a level the oldest wins, then
// the first by name, as in istiod. In the root namespace the namespace's
// policy is the mesh's.
func Decide(policies iter.Seq[*securityv1.PeerAuthentication], rootNS, ns string, lbls map[string]string, empty EmptySelector) PeerAuthentications {
	var out PeerAuthentications
	for pa := range policies {
		switch {
		case pa.Namespace != ns && pa.Namespace != rootNS:
		case WorkloadBound(pa, empty):
			if pa.Namespace == ns && lbls != nil && PeerAuthSelects(pa, lbls) {
				out.Workload = Older(out.Workload, pa)
			}
		case pa.Namespace == rootNS:
			out.Mesh = Older(out.Mesh, pa)
		default:
			out.Namespace = Older(out.Namespace, pa)
		}
	}
	return out
}

// Older returns the older of two policies (by creation time, then name);
// a nil one loses.
func Older(a, b *securityv1.PeerAuthentication) *securityv1.PeerAuthentication {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case b.CreationTimestamp.Before(&a.CreationTimestamp),
		b.CreationTimestamp.Equal(&a.CreationTimestamp) && b.Name < a.Name:
		return b
	default:
		return a
	}
}
