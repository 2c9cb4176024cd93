package workloadtable

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// ErrVIPHeld rejects a service that claims a VIP another service holds.
var ErrVIPHeld = errors.New("VIP held by another service")

// Who holds a VIP.
//
// The Service proto carries no creation time, so the table cannot apply
// the control plane's precedence (a Kubernetes Service, then the oldest
// ServiceEntry); it keeps the first holder instead. A control plane that
// resolves conflicts itself (Canopy's does) never sends two services that
// contend for a VIP; one that does cannot move a VIP by writing last.
//
// Claims to a VIP are kept in the order they came. In that order, a claim
// holds unless it contends with a claim that already holds. Two services
// contend when some client could see both: unless both have visibility
// NAMESPACE in different namespaces. The hosts of one object (same
// namespace and name: a ServiceEntry's hosts all carry its addresses)
// never contend. A service updated in place keeps its place; when the
// holder goes or drops the VIP, the claim that waited longest takes it,
// so the VIP is not unmapped while a claimant remains.

// putService stores a service under key and records its claims: VIPs it
// already claimed keep their place, new ones are claimed last, dropped
// ones are released.
func (t *Table) putService(key string, svc *workloadapi.Service) {
	var before []string
	if old := t.services[key]; old != nil {
		before = vipKeys(old)
		t.unindexHostname(old.GetHostname(), key)
	}
	t.services[key] = svc
	h := strings.ToLower(svc.GetHostname())
	if t.byHostname[h] == nil {
		t.byHostname[h] = map[string]struct{}{}
	}
	t.byHostname[h][key] = struct{}{}
	after := vipKeys(svc)
	for _, v := range before {
		if !slices.Contains(after, v) {
			t.unclaim(v, key)
		}
	}
	for _, v := range after {
		if !slices.Contains(t.byVIP[v], key) {
			t.byVIP[v] = append(t.byVIP[v], key)
		}
	}
}

// unclaim withdraws key's claim to VIP v.
func (t *Table) unclaim(v, key string) {
	claims := slices.DeleteFunc(t.byVIP[v], func(k string) bool { return k == key })
	if len(claims) == 0 {
		delete(t.byVIP, v)
		return
	}
	t.byVIP[v] = claims
}

// holders are the keys of the services holding VIP v.
func (t *Table) holders(v string) []string {
	var held []string
	for _, k := range t.byVIP[v] {
		s := t.services[k]
		if !slices.ContainsFunc(held, func(h string) bool { return contend(s, t.services[h]) }) {
			held = append(held, k)
		}
	}
	return held
}

// checkVIPs returns an error naming the first VIP service key claims but
// does not hold, and its holder.
func (t *Table) checkVIPs(key string) error {
	svc := t.services[key]
	if svc == nil {
		return nil // removed later in the same response
	}
	for _, v := range vipKeys(svc) {
		held := t.holders(v)
		if slices.Contains(held, key) {
			continue
		}
		for _, h := range held {
			if contend(svc, t.services[h]) {
				return fmt.Errorf("%w: %s by %s", ErrVIPHeld, v, h)
			}
		}
	}
	return nil
}

// vipService is the holder of VIP v that a client in namespace ns sees.
func (t *Table) vipService(v, ns string) *workloadapi.Service {
	for _, k := range t.holders(v) {
		if s := t.services[k]; visibleTo(s, ns) {
			return s
		}
	}
	return nil
}

// contend reports whether two services cannot both hold one VIP.
func contend(a, b *workloadapi.Service) bool {
	if a.GetNamespace() == b.GetNamespace() && a.GetName() == b.GetName() {
		return false
	}
	return public(a) || public(b) || a.GetNamespace() == b.GetNamespace()
}

// visibleTo reports whether a client in namespace ns may see s. Any
// visibility but PUBLIC is read as NAMESPACE, the narrower one.
func visibleTo(s *workloadapi.Service, ns string) bool {
	return public(s) || s.GetNamespace() == ns
}

func public(s *workloadapi.Service) bool {
	return s.GetVisibility() == workloadapi.Service_PUBLIC
}

// vipKeys are a service's VIP keys, as workloadapi.Aliases names them.
func vipKeys(s *workloadapi.Service) []string {
	return workloadapi.Aliases(&workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}})
}
