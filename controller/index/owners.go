package index

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Ownership of Service names and VIPs.
//
// Several objects may want to publish a Service under one name
// ("<namespace>/<hostname>": a ServiceEntry host equal to a Service's FQDN,
// two ServiceEntries sharing a host): the claim that precedes the others
// (ambient.Claim.Precedes) wins the name and the others wait.
//
// The winners of different names may claim one VIP (a ServiceEntry
// address equal to a Service's cluster IP or to another ServiceEntry's
// address): ambient.Resolve decides which of them hold it, and the others
// are published without it. A node proxy maps a VIP to one service, so
// without this the last service written would capture the traffic meant
// for the first.
//
// Every losing object is reported (Problems) with the object that won.

// serviceSource is one object's Service under a name; a nil service
// withdraws the object's claim.
type serviceSource struct {
	service *workloadapi.Service
	claim   ambient.Claim
}

// publishService records (or, with a nil Service, withdraws) one source's
// Service under name, picks the name's winner, re-decides who holds the
// VIPs the name held or claims, and republishes every name whose
// addresses that may change.
func (x *Index) publishService(c *change, name string, src serviceSource) {
	owner := src.claim.Owner()
	sources := x.serviceSources[name]
	if src.service == nil {
		delete(sources, owner)
		x.clearConflict(owner, "host "+name)
	} else {
		if sources == nil {
			sources = map[string]serviceSource{}
			x.serviceSources[name] = sources
		}
		sources[owner] = src
	}
	var best serviceSource
	found := false
	for _, s := range sources {
		if !found || s.claim.Precedes(best.claim) {
			best, found = s, true
		}
	}
	for o, s := range sources {
		if o == best.claim.Owner() {
			x.clearConflict(o, "host "+name)
			continue
		}
		x.setConflict(o, "host "+name, fmt.Sprintf("host %s in namespace %s is served by %s; this %s's is not sent",
			s.service.GetHostname(), s.service.GetNamespace(), best.claim.Owner(), s.claim.Kind))
	}
	if len(sources) == 0 {
		delete(x.serviceSources, name)
	}

	// The name's claims to VIPs, and its part in choosing the hostname's
	// canonical Service, follow its winner.
	old, had := x.serviceWinners[name]
	var oldVIPs, newVIPs []string
	if had {
		// republishService reports it again if it still is the winner.
		x.clearConflict(old.claim.Owner(), "zone "+name)
		oldVIPs = vipKeys(old.service)
		for _, v := range oldVIPs {
			delete(x.vipClaims[v], name)
			if len(x.vipClaims[v]) == 0 {
				delete(x.vipClaims, v)
			}
			x.clearConflict(old.claim.Owner(), "address "+v)
		}
	}
	if found {
		best.claim.Visibility = best.service.GetVisibility()
		x.serviceWinners[name] = best
		newVIPs = vipKeys(best.service)
		for _, v := range newVIPs {
			if x.vipClaims[v] == nil {
				x.vipClaims[v] = map[string]ambient.Claim{}
			}
			x.vipClaims[v][name] = best.claim
		}
	} else {
		delete(x.serviceWinners, name)
	}

	affected := map[string]bool{name: true}
	for _, h := range []string{old.service.GetHostname(), best.service.GetHostname()} {
		if h == "" {
			continue
		}
		x.linkHostname(h, name)
		for n := range x.hostNames[h] {
			affected[n] = true
		}
	}
	for _, v := range append(oldVIPs, newVIPs...) {
		for n := range x.vipClaims[v] {
			affected[n] = true
		}
		x.reportVIP(v)
	}
	for _, n := range slices.Sorted(maps.Keys(affected)) {
		x.republishService(c, n)
	}
}

// linkHostname records whether name has a winner under hostname h.
func (x *Index) linkHostname(h, name string) {
	if w, ok := x.serviceWinners[name]; ok && w.service.GetHostname() == h {
		if x.hostNames[h] == nil {
			x.hostNames[h] = map[string]bool{}
		}
		x.hostNames[h][name] = true
		return
	}
	delete(x.hostNames[h], name)
	if len(x.hostNames[h]) == 0 {
		delete(x.hostNames, h)
	}
}

// canonicalName is the name whose Service is canonical among those
// published under hostname h (ambient.CanonicalClaim), or "".
func (x *Index) canonicalName(h string) string {
	names := slices.Sorted(maps.Keys(x.hostNames[h]))
	claims := make([]ambient.Claim, len(names))
	for i, n := range names {
		claims[i] = x.serviceWinners[n].claim
	}
	if i, ok := ambient.CanonicalClaim(h, claims, x.cfg); ok {
		return names[i]
	}
	return ""
}

// republishService publishes a name's winning Service without the VIPs
// it does not hold, canonical when it is its hostname's choice, or removes
// the name when it has no winner.
func (x *Index) republishService(c *change, name string) {
	w, ok := x.serviceWinners[name]
	if !ok {
		x.setAddress(c, name, nil)
		return
	}
	x.reportForeignHost(name, w)
	svc := w.service
	var kept []*workloadapi.NetworkAddress
	for _, a := range svc.GetAddresses() {
		if v, ok := vipKey(a); !ok || x.holds(v, name) {
			kept = append(kept, a)
		}
	}
	canonical := svc.GetCanonical() || x.canonicalName(svc.GetHostname()) == name
	if len(kept) != len(svc.GetAddresses()) || canonical != svc.GetCanonical() {
		// Published protos are never modified: publish a copy.
		svc = proto.Clone(svc).(*workloadapi.Service)
		svc.Addresses = kept
		svc.Canonical = canonical
	}
	x.setAddress(c, name, &workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}})
}

// reportForeignHost records, for a ServiceEntry publishing name whose
// host is another namespace's Service name (ambient.ForeignServiceHost),
// that node proxies answer it with the entry only to its own namespace,
// naming the Service it does not shadow when there is one.
func (x *Index) reportForeignHost(name string, w serviceSource) {
	h, ns := w.service.GetHostname(), w.claim.Namespace
	if w.claim.Kind != ambient.KindServiceEntry || !ambient.ForeignServiceHost(h, ns, x.cfg) {
		x.clearConflict(w.claim.Owner(), "zone "+name)
		return
	}
	msg := fmt.Sprintf("host %s is another namespace's Service name: node proxies answer it with this ServiceEntry only to pods of namespace %s, and it is never canonical", h, ns)
	for _, n := range slices.Sorted(maps.Keys(x.hostNames[h])) {
		if o := x.serviceWinners[n]; o.claim.Kind == ambient.KindService {
			msg = fmt.Sprintf("host %s is the name of Service %s/%s: every namespace but %s gets the Service, and this ServiceEntry is never canonical",
				h, o.claim.Namespace, o.claim.Name, ns)
			break
		}
	}
	x.setConflict(w.claim.Owner(), "zone "+name, msg)
}

// vipOutcomes resolves the claims to VIP v, by claiming name.
func (x *Index) vipOutcomes(v string) map[string]ambient.Outcome {
	names := slices.Sorted(maps.Keys(x.vipClaims[v]))
	claims := make([]ambient.Claim, len(names))
	for i, n := range names {
		claims[i] = x.vipClaims[v][n]
	}
	out := make(map[string]ambient.Outcome, len(names))
	for i, o := range ambient.Resolve(claims) {
		out[names[i]] = o
	}
	return out
}

// holds reports whether name's claim to VIP v holds.
func (x *Index) holds(v, name string) bool {
	if len(x.vipClaims[v]) <= 1 {
		return true
	}
	return x.vipOutcomes(v)[name].Holds
}

// reportVIP records, for every object whose claim to VIP v lost, the
// object that holds it.
func (x *Index) reportVIP(v string) {
	for n, o := range x.vipOutcomes(v) {
		owner := x.vipClaims[v][n].Owner()
		if o.Holds {
			x.clearConflict(owner, "address "+v)
			continue
		}
		x.setConflict(owner, "address "+v, fmt.Sprintf("address %s is owned by %s; this %s is sent without it",
			vipText(v), o.LostTo.Owner(), x.vipClaims[v][n].Kind))
	}
}

func (x *Index) setConflict(owner, subject, msg string) {
	if x.conflicts[owner] == nil {
		x.conflicts[owner] = map[string]string{}
	}
	x.conflicts[owner][subject] = msg
}

func (x *Index) clearConflict(owner, subject string) {
	delete(x.conflicts[owner], subject)
	if len(x.conflicts[owner]) == 0 {
		delete(x.conflicts, owner)
	}
}

// conflictProblems joins each object's lost names and addresses into one
// message.
func (x *Index) conflictProblems() map[string]string {
	out := make(map[string]string, len(x.conflicts))
	for owner, subjects := range x.conflicts {
		msgs := make([]string, 0, len(subjects))
		for _, s := range slices.Sorted(maps.Keys(subjects)) {
			msgs = append(msgs, subjects[s])
		}
		out[owner] = strings.Join(msgs, "; ")
	}
	return out
}

// vipKeys are the keys of a Service's VIPs, as node proxies index them.
func vipKeys(s *workloadapi.Service) []string {
	var out []string
	for _, a := range s.GetAddresses() {
		if v, ok := vipKey(a); ok {
			out = append(out, v)
		}
	}
	return out
}

// vipKey is "<network>/<ip>", or "<network>/<ip>/<length>" for a CIDR.
func vipKey(a *workloadapi.NetworkAddress) (string, bool) {
	ip, ok := netip.AddrFromSlice(a.GetAddress())
	if !ok {
		return "", false
	}
	if a.Length != nil {
		p := netip.PrefixFrom(ip, int(a.GetLength()))
		if !p.IsValid() {
			return "", false
		}
		return workloadapi.CIDRKey(a.GetNetwork(), p), true
	}
	return workloadapi.IPKey(a.GetNetwork(), ip), true
}

// vipText is a VIP key as people read it: the address, with its network
// when it has one.
func vipText(v string) string {
	network, addr, _ := strings.Cut(v, "/")
	if network == "" {
		return addr
	}
	return addr + " (network " + network + ")"
}
