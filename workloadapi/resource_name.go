package workloadapi

import "net/netip"

// ResourceName returns an Address's xDS primary name
// (docs/wire-contract.md §1.9): a workload's UID, or a service's
// "<namespace>/<hostname>". It is empty for an Address that holds neither.
func ResourceName(a *Address) string {
	if w := a.GetWorkload(); w != nil {
		return w.GetUid()
	}
	if s := a.GetService(); s != nil {
		return ServiceKey(s.GetNamespace(), s.GetHostname())
	}
	return ""
}

// Aliases returns the names an Address is also found by in on-demand lookups
// (docs/wire-contract.md §1.9, §2.4): "<network>/<ip>" for each workload
// address and service VIP, "<network>/<ip>/<len>" for a CIDR VIP. Malformed
// addresses are skipped: a name that cannot be looked up is no alias.
func Aliases(a *Address) []string {
	var out []string
	if w := a.GetWorkload(); w != nil {
		for _, b := range w.GetAddresses() {
			if ip, ok := netip.AddrFromSlice(b); ok {
				out = append(out, IPKey(w.GetNetwork(), ip))
			}
		}
		return out
	}
	for _, na := range a.GetService().GetAddresses() {
		ip, ok := netip.AddrFromSlice(na.GetAddress())
		if !ok {
			continue
		}
		if na.Length != nil {
			p := netip.PrefixFrom(ip, int(na.GetLength()))
			if !p.IsValid() {
				continue
			}
			out = append(out, CIDRKey(na.GetNetwork(), p))
			continue
		}
		out = append(out, IPKey(na.GetNetwork(), ip))
	}
	return out
}
