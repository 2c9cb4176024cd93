package ambient

import (
	"slices"
	"strings"
	"time"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Kinds of the objects that claim Service names and addresses.
const (
	KindService      = "Service"
	KindServiceEntry = "ServiceEntry"
)

// Claim is one object's claim to a Service name ("<namespace>/<hostname>")
// or to a VIP. Several objects may claim the same one: a ServiceEntry host
// equal to a Service's name, a ServiceEntry address equal to a Service's
// cluster IP or to another ServiceEntry's address. Resolve decides.
type Claim struct {
	// Kind is KindService or KindServiceEntry.
	Kind            string
	Namespace, Name string
	// Created is the object's creation timestamp.
	Created time.Time
	// Visibility is who sees the claimant's Service (from its exportTo).
	Visibility workloadapi.Service_Visibility
}

// Owner names the claimant as problems are keyed: "<Kind> <namespace>/<name>".
func (c Claim) Owner() string { return c.Kind + " " + c.Namespace + "/" + c.Name }

// Precedes reports whether c takes precedence over d: a Kubernetes Service
// over a ServiceEntry (it owns its name and its cluster IPs), then the
// older object, then the smaller namespace/name. Istio orders the
// Services that share a hostname the same way (a Kubernetes Service, else
// the oldest ServiceEntry); the name breaks the ties of equal timestamps,
// which have a one-second resolution, so that every controller replica
// decides alike.
func (c Claim) Precedes(d Claim) bool {
	if ck, dk := c.Kind == KindService, d.Kind == KindService; ck != dk {
		return ck
	}
	if !c.Created.Equal(d.Created) {
		return c.Created.Before(d.Created)
	}
	if c.Namespace != d.Namespace {
		return c.Namespace < d.Namespace
	}
	if c.Name != d.Name {
		return c.Name < d.Name
	}
	return c.Kind < d.Kind
}

// Contends reports whether c and d cannot both hold one VIP:
//   - claims of one object never contend (its hosts share its addresses);
//   - a Kubernetes Service contends with every other claim: its cluster
//     IPs are its own, whoever could see the other claimant;
//   - two ServiceEntries contend when some client could see both, that is
//     unless both are visible only in their own, different, namespaces.
func (c Claim) Contends(d Claim) bool {
	if c.Kind == d.Kind && c.Namespace == d.Namespace && c.Name == d.Name {
		return false
	}
	if c.Kind == KindService || d.Kind == KindService {
		return true
	}
	return VisibilitiesOverlap(c.Namespace, c.Visibility, d.Namespace, d.Visibility)
}

// VisibilitiesOverlap reports whether a client could see both a service of
// namespace ns1 with visibility v1 and one of ns2 with v2. Any visibility
// but PUBLIC counts as the service's namespace only.
func VisibilitiesOverlap(ns1 string, v1 workloadapi.Service_Visibility, ns2 string, v2 workloadapi.Service_Visibility) bool {
	return v1 == workloadapi.Service_PUBLIC || v2 == workloadapi.Service_PUBLIC || ns1 == ns2
}

// Outcome is what Resolve decided for one claim.
type Outcome struct {
	// Holds reports that the claim keeps the address.
	Holds bool
	// LostTo is the claim that took the address, when Holds is false.
	LostTo Claim
}

// Resolve decides which claims to one VIP hold it. In precedence order,
// each claim holds unless it contends with a claim that already holds, to
// which it loses. The outcomes are in the order of claims.
func Resolve(claims []Claim) []Outcome {
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		switch {
		case claims[i].Precedes(claims[j]):
			return -1
		case claims[j].Precedes(claims[i]):
			return 1
		}
		return 0
	})
	out := make([]Outcome, len(claims))
	var held []int
	for _, i := range order {
		out[i].Holds = true
		for _, h := range held {
			if claims[i].Contends(claims[h]) {
				out[i] = Outcome{LostTo: claims[h]}
				break
			}
		}
		if out[i].Holds {
			held = append(held, i)
		}
	}
	return out
}

// CanonicalClaim picks, of the claims that publish hostname host in
// different namespaces (one claim per namespace), the one whose Service is
// canonical, which a client uses when none is in its own namespace. As
// istiod picks (selectWorkloadServices in
// pilot/pkg/serviceregistry/ambient/services.go): a Kubernetes Service,
// else the first by Precedes (the oldest) of the ServiceEntries visible
// beyond their own namespace; ok is false when there is none.
//
// Unlike istiod, a ServiceEntry whose host is another namespace's Service
// name (ForeignServiceHost) is never canonical, not even while no Service
// has that name: the names under <ns>.svc.<domain> are that namespace's,
// and a canonical copy would answer them for every namespace.
func CanonicalClaim(host string, claims []Claim, cfg Config) (int, bool) {
	best := -1
	for i, c := range claims {
		if c.Kind != KindService && (c.Visibility == workloadapi.Service_NAMESPACE || ForeignServiceHost(host, c.Namespace, cfg)) {
			continue
		}
		if best < 0 || c.Precedes(claims[best]) {
			best = i
		}
	}
	return best, best >= 0
}

// ForeignServiceHost reports whether host, published by an object of
// namespace ns, is a Kubernetes Service name of another namespace: under
// <other>.svc.<domain> (payments.prod.svc.cluster.local or
// *.prod.svc.cluster.local for an object of namespace attacker), or a
// wildcard covering every namespace's names (*.svc.<domain>,
// *.<domain>, ...). Node proxies answer such a name with the object's
// Service only to the clients of ns, and it is never canonical: one
// namespace cannot take another's Service names, and a ServiceEntry never
// shadows a Service for anyone but its own namespace.
func ForeignServiceHost(host, ns string, cfg Config) bool {
	cfg = cfg.WithDefaults()
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	zone := "svc." + cfg.DomainSuffix
	if wild, ok := strings.CutPrefix(h, "*."); ok && strings.HasSuffix("."+zone, "."+wild) {
		return true
	}
	rest, ok := strings.CutSuffix(h, "."+zone)
	if !ok || rest == "" {
		return false
	}
	return rest[strings.LastIndexByte(rest, '.')+1:] != ns
}
