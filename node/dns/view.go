package dns

import (
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/node/configdump"
	"github.com/canopy-mesh/canopy/node/dns/authority"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// View is the DNS of the pod "<namespace>/<name>" as the server answers
// it, and whether the pod is served. services are every service the
// table holds (the view lists those the pod sees).
func (s *Server) View(pod string, services []*workloadapi.Service) (configdump.DNSView, bool) {
	s.mu.Lock()
	p := s.pods[pod]
	s.mu.Unlock()
	if p == nil {
		return configdump.DNSView{}, false
	}
	v := configdump.DNSView{Pod: pod, ClusterDomain: s.cfg.ClusterDomain, Resolvers: []string{}, Names: []configdump.DNSName{}}
	p.mu.Lock()
	if p.up.Forwarder != nil {
		v.Resolvers, v.ResolversFrom = append(v.Resolvers, p.up.Nameservers...), p.up.From
	}
	p.mu.Unlock()
	self := p.current()
	client := authority.Client{Namespace: self.GetNamespace(), Network: self.GetNetwork()}
	seen := map[string]bool{}
	for _, svc := range services {
		name := strings.ToLower(svc.GetHostname())
		if seen[name] {
			continue
		}
		// Asked as the pod would ask it, so the view shows the
		// service that wins for the pod (authority.Lookup: its own
		// namespace's, else the canonical one; never another namespace's
		// entry under a namespace's Service names).
		v4, ok := authority.Lookup(s.cfg.Table, s.cfg.ClusterDomain, client, name, authority.IPv4)
		if !ok {
			continue
		}
		seen[name] = true
		v6, _ := authority.Lookup(s.cfg.Table, s.cfg.ClusterDomain, client, name, authority.IPv6)
		n := configdump.DNSName{Name: name, Service: v4.Service.GetNamespace() + "/" + v4.Service.GetHostname(), Addresses: []string{}}
		for _, a := range append(v4.Addrs, v6.Addrs...) {
			n.Addresses = append(n.Addresses, a.String())
		}
		v.Names = append(v.Names, n)
	}
	slices.SortFunc(v.Names, func(a, b configdump.DNSName) int { return strings.Compare(a.Name, b.Name) })
	return v, true
}
