package workloadapi

import (
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Defaults that the protocol leaves out of a Workload: readers must apply
// them to empty fields.
const (
	DefaultTrustDomain    = "cluster.local"
	DefaultServiceAccount = "default"
)

// Identity is a workload's SPIFFE identity,
// "spiffe://<trust domain>/ns/<namespace>/sa/<service account>".
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// WorkloadIdentity returns w's identity, applying the defaults for an empty
// trust domain and service account.
func WorkloadIdentity(w *Workload) Identity {
	id := Identity{TrustDomain: w.GetTrustDomain(), Namespace: w.GetNamespace(), ServiceAccount: w.GetServiceAccount()}
	if id.TrustDomain == "" {
		id.TrustDomain = DefaultTrustDomain
	}
	if id.ServiceAccount == "" {
		id.ServiceAccount = DefaultServiceAccount
	}
	return id
}

// String returns the SPIFFE URI, the form used in certificate URI SANs.
func (i Identity) String() string {
	return "spiffe://" + i.Principal()
}

// Principal returns the identity without "spiffe://", the form that
// authorization policies match principals against.
func (i Identity) Principal() string {
	return i.TrustDomain + "/ns/" + i.Namespace + "/sa/" + i.ServiceAccount
}

// ParseIdentity parses a SPIFFE ID of the form
// "spiffe://<trust domain>/ns/<namespace>/sa/<service account>". The ID must be
// valid by the SPIFFE specification (lower-case trust domain; path segments of
// letters, digits, '.', '-' and '_'; no query or fragment) and have exactly
// that path.
func ParseIdentity(s string) (Identity, error) {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: spiffe id %q: %w", ErrMalformedName, s, err)
	}
	// A valid SPIFFE path has no empty, "." or ".." segments, so a plain
	// split is exact.
	seg := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(seg) != 4 || seg[0] != "ns" || seg[2] != "sa" {
		return Identity{}, fmt.Errorf("%w: spiffe id %q: path %q is not /ns/<namespace>/sa/<service account>", ErrMalformedName, s, id.Path())
	}
	return Identity{TrustDomain: id.TrustDomain().Name(), Namespace: seg[1], ServiceAccount: seg[3]}, nil
}
