// Package authority decides what the node proxy's DNS server answers
// itself (docs/wire-contract.md §4.6): the mesh's names, Kubernetes Services
// and ServiceEntry hosts, from the workload xDS table, as a client in a
// given namespace sees them. Everything else is not the mesh's and goes
// to the pod's own resolvers. It is pure: the table is read through an
// interface and nothing here does I/O.
//
// A name matches, in this order: itself; its Kubernetes expansions
// (echo → echo.<ns>.svc.<domain>, echo.other → echo.other.svc.<domain>,
// ...); and, when it ends in one of the client's search domains
// (<ns>.svc.<domain>, svc.<domain>, <domain>), the name with that suffix
// stripped and its expansions. The stripping ends a resolver's ndots walk
// at its first step: api.example.com.<ns>.svc.cluster.local is answered
// with a CNAME to api.example.com and its addresses, instead of five
// NXDOMAINs from the cluster resolver before the name is tried as is.
// Each candidate is tried as is, then as the wildcard hosts that cover it
// (*.example.com, *.com).
//
// Several services may have the hostname matched (ServiceEntries of
// several namespaces, or one copying a Kubernetes Service's name). Of
// those the client may see, it gets its own namespace's, else the
// canonical one (a Kubernetes Service is always canonical), else the
// first by namespace, as ztunnel does. A name under svc.<domain> of
// namespace prod (payments.prod.svc.<domain>) is prod's: a service of
// another namespace answers it, exactly or by a wildcard, only for that
// namespace's own clients. So a ServiceEntry never shadows a Kubernetes
// Service for anyone outside the ServiceEntry's namespace.
package authority

import (
	"net/netip"
	"strings"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Services is the part of the workload table the answers come from;
// *workloadtable.Table implements it.
type Services interface {
	// ByHostname is the services with a hostname, in every namespace.
	ByHostname(host string) []*workloadapi.Service
	// ServiceWorkloads is the workloads of a service key
	// ("<namespace>/<hostname>").
	ServiceWorkloads(key string) []*workloadapi.Workload
}

// Family is the address family a query asks for: A or AAAA.
type Family int

// Families.
const (
	IPv4 Family = 4 // A
	IPv6 Family = 6 // AAAA
)

// Client is who asks: the pod the query came from.
type Client struct {
	Namespace string
	// Network is the pod's network: only addresses on it are answered.
	Network string
}

// Answer is a mesh name's answer. No address is an answer too (NOERROR
// without records): the name exists, not with that family. Saying
// NXDOMAIN would make a client asking A and AAAA at once fail the whole
// name.
type Answer struct {
	// CNAME, when set, is the name the query is an alias of, and the
	// owner of Addrs; otherwise Addrs are the query name's.
	CNAME string
	Addrs []netip.Addr
	// Service is the service answered, for logs and views.
	Service *workloadapi.Service
}

// DefaultClusterDomain is the Kubernetes cluster domain unless told.
const DefaultClusterDomain = "cluster.local"

// Lookup answers qname (any case, with or without the final dot) for the
// family fam as client c sees the mesh, and reports false when the name
// is not the mesh's.
func Lookup(src Services, clusterDomain string, c Client, qname string, fam Family) (Answer, bool) {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	q := strings.TrimSuffix(strings.ToLower(qname), ".")
	if q == "" || strings.HasPrefix(q, ".") || strings.Contains(q, "..") {
		return Answer{}, false
	}
	for _, a := range aliases(q, c.Namespace, clusterDomain) {
		zone := zoneNamespace(a.name, clusterDomain)
		for i, host := range wildcards(a.name) {
			svc := best(src.ByHostname(host), c.Namespace, zone, clusterDomain)
			if svc == nil {
				continue
			}
			ans := Answer{Service: svc, Addrs: addresses(src, svc, c.Network, fam)}
			if a.stripped != "" && i == 0 {
				ans.CNAME = a.stripped
			}
			return ans, true
		}
	}
	return Answer{}, false
}

// alias is a name the query may stand for; stripped, when set, is the
// query with a search domain removed, which the answer names in a CNAME.
type alias struct {
	name, stripped string
}

// aliases are the names q may stand for, in the order they are tried.
func aliases(q, ns, domain string) []alias {
	out := []alias{{name: q}}
	for _, e := range expansions(q, ns, domain) {
		out = append(out, alias{name: e})
	}
	for _, search := range []string{ns + ".svc." + domain, "svc." + domain, domain} {
		s, ok := strings.CutSuffix(q, "."+search)
		if !ok || s == "" {
			continue
		}
		out = append(out, alias{name: s, stripped: s})
		for _, e := range expansions(s, ns, domain) {
			out = append(out, alias{name: e, stripped: s})
		}
	}
	return out
}

// expansions are the Kubernetes names a short name stands for in a pod of
// namespace ns: a service (echo), a service in another namespace
// (echo.other), with or without "svc".
func expansions(n, ns, domain string) []string {
	labels := strings.Split(n, ".")
	last := labels[len(labels)-1]
	switch len(labels) {
	case 1:
		return []string{n + "." + ns + ".svc." + domain}
	case 2:
		return []string{n + ".svc." + domain, n + "." + ns + ".svc." + domain}
	case 3:
		if last == "svc" {
			return []string{n + "." + domain}
		}
		return []string{n + ".svc." + domain}
	case 4:
		if last == "svc" {
			return []string{n + "." + domain}
		}
	}
	return nil
}

// wildcards are n, then the wildcard hosts covering it, most specific
// first: www.example.com, *.example.com, *.com.
func wildcards(n string) []string {
	out := []string{n}
	for rest := n; ; {
		_, after, ok := strings.Cut(rest, ".")
		if !ok {
			return out
		}
		out = append(out, "*."+after)
		rest = after
	}
}

// best is the service a client in ns gets among those with one hostname
// (sorted by key), as ztunnel's ServiceMatch::find_best_match picks:
// its own namespace's, else the canonical one, else the first it may
// see. The canonical mark is what keeps a ServiceEntry of one namespace
// from shadowing, for everyone else, the Kubernetes Service whose name
// it copies: the controller marks the Service, never the copy.
//
// zone is the namespace whose Service names ("<name>.<zone>.svc.<domain>")
// the looked-up name is under, or "". Those names are that namespace's:
// a service of another namespace answers one (a ServiceEntry host
// payments.prod.svc.cluster.local in namespace attacker, or a wildcard
// covering it) for clients of its own namespace only, as a
// namespace-local override, whatever its canonical mark says. Without
// this, a ServiceEntry would take prod's names for every other namespace
// while prod has no Service of that name (before it is created, or while
// it is recreated), and a control plane that marks the oldest
// ServiceEntry canonical then (istiod does) would hand it every namespace.
//
// A service without addresses is an answer only for a Kubernetes
// headless service (its endpoints are the answer); a ServiceEntry
// without addresses leaves the name to the resolvers.
func best(svcs []*workloadapi.Service, ns, zone, domain string) *workloadapi.Service {
	var canonical, first *workloadapi.Service
	for _, s := range svcs {
		if s == nil || !visibleTo(s, ns) {
			continue
		}
		if zone != "" && s.GetNamespace() != zone && s.GetNamespace() != ns {
			continue
		}
		if len(s.GetAddresses()) == 0 && !strings.HasSuffix(strings.ToLower(s.GetHostname()), ".svc."+domain) {
			continue
		}
		if s.GetNamespace() == ns {
			return s
		}
		if canonical == nil && s.GetCanonical() {
			canonical = s
		}
		if first == nil {
			first = s
		}
	}
	if canonical != nil {
		return canonical
	}
	return first
}

// zoneNamespace is the namespace whose Kubernetes Service names name is
// under: prod for payments.prod.svc.<domain> (and for a.b.prod.svc.<domain>),
// "" for a name outside svc.<domain>.
func zoneNamespace(name, domain string) string {
	rest, ok := strings.CutSuffix(name, ".svc."+domain)
	if !ok || rest == "" {
		return ""
	}
	return rest[strings.LastIndexByte(rest, '.')+1:]
}

// visibleTo reports whether a client in ns may see s: a PUBLIC service,
// or one of its own namespace.
func visibleTo(s *workloadapi.Service, ns string) bool {
	return s.GetVisibility() == workloadapi.Service_PUBLIC || s.GetNamespace() == ns
}

// addresses are the service's addresses of family fam on network: its
// VIPs, or, without VIPs (a headless service), the first address of that
// family of each of its workloads.
func addresses(src Services, s *workloadapi.Service, network string, fam Family) []netip.Addr {
	switch {
	case fam == IPv6 && s.GetIpFamilies() == workloadapi.IPFamilies_IPV4_ONLY,
		fam == IPv4 && s.GetIpFamilies() == workloadapi.IPFamilies_IPV6_ONLY:
		return nil
	}
	var out []netip.Addr
	if len(s.GetAddresses()) > 0 {
		for _, na := range s.GetAddresses() {
			if na.GetNetwork() != network {
				continue
			}
			if ip, ok := ofFamily(na.GetAddress(), fam); ok {
				out = append(out, ip)
			}
		}
		return out
	}
	for _, w := range src.ServiceWorkloads(s.GetNamespace() + "/" + s.GetHostname()) {
		if w.GetNetwork() != network {
			continue
		}
		for _, b := range w.GetAddresses() {
			if ip, ok := ofFamily(b, fam); ok {
				out = append(out, ip)
				break
			}
		}
	}
	return out
}

// ofFamily parses an address and reports whether it is of family fam.
func ofFamily(b []byte, fam Family) (netip.Addr, bool) {
	ip, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	if (fam == IPv4) != ip.Is4() {
		return netip.Addr{}, false
	}
	return ip, true
}
