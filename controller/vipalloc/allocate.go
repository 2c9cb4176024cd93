package vipalloc

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// The ranges istiod allocates from (PILOT_IP_AUTOALLOCATE_IPV4_PREFIX and
// PILOT_IP_AUTOALLOCATE_IPV6_PREFIX): class E and the IPv6 benchmarking
// range, neither routed anywhere.
const (
	DefaultIPv4Range = "240.240.0.0/16"
	DefaultIPv6Range = "2001:2::/48"
)

// maxProbes bounds the search for a free address after the hashed start.
// An IPv4 range of up to /16 is searched whole.
const maxProbes = 1 << 16

// Ranges are the prefixes VIPs are allocated from.
type Ranges struct {
	IPv4, IPv6 netip.Prefix
}

// DefaultRanges are istiod's ranges.
func DefaultRanges() Ranges {
	return Ranges{IPv4: netip.MustParsePrefix(DefaultIPv4Range), IPv6: netip.MustParsePrefix(DefaultIPv6Range)}
}

// Validate checks that the ranges are of the right families and leave room
// for addresses.
func (r Ranges) Validate() error {
	if !r.IPv4.IsValid() || !r.IPv4.Addr().Is4() || r.IPv4.Bits() > 30 {
		return fmt.Errorf("IPv4 range %s: want an IPv4 prefix of /30 or shorter", r.IPv4)
	}
	if !r.IPv6.IsValid() || !r.IPv6.Addr().Is6() || r.IPv6.Addr().Is4In6() || r.IPv6.Bits() > 126 {
		return fmt.Errorf("IPv6 range %s: want an IPv6 prefix of /126 or shorter", r.IPv6)
	}
	return nil
}

// Holders returns the ServiceEntries that hold an address, in their
// spec.addresses or their status.addresses. It may include the entry being
// allocated for.
type Holders func(netip.Addr) []*networkingv1.ServiceEntry

// Allocate returns the status.addresses a ServiceEntry should have: for
// each host that qualifies (ambient.AutoAllocatedHost), in spec order, one
// IPv4 and one IPv6 address; none when the entry does not qualify
// (ambient.AutoAllocates), which clears what it had. A host keeps the
// addresses it holds unless another entry has a better claim (keeps); a
// missing or lost one is allocated anew (next).
func Allocate(se *networkingv1.ServiceEntry, holders Holders, r Ranges) []*networkingapi.ServiceEntryAddress {
	if !ambient.AutoAllocates(se) {
		return nil
	}
	held := map[string][]netip.Addr{}
	for _, a := range se.Status.GetAddresses() {
		if ip, err := netip.ParseAddr(a.GetValue()); err == nil {
			held[a.GetHost()] = append(held[a.GetHost()], ip.Unmap())
		}
	}
	taken := map[netip.Addr]bool{}
	seen := map[string]bool{}
	var out []*networkingapi.ServiceEntryAddress
	for _, host := range se.Spec.GetHosts() {
		if seen[host] || !ambient.AutoAllocatedHost(se, host) {
			continue
		}
		seen[host] = true
		var v4, v6 netip.Addr
		for _, a := range held[host] {
			switch {
			case taken[a] || !keeps(se, a, holders):
			case a.Is4() && !v4.IsValid():
				v4 = a
			case a.Is6() && !v6.IsValid():
				v6 = a
			}
		}
		if !v4.IsValid() {
			v4 = next(se, host, r.IPv4, taken, holders)
		}
		if !v6.IsValid() {
			v6 = next(se, host, r.IPv6, taken, holders)
		}
		for _, a := range []netip.Addr{v4, v6} {
			if a.IsValid() {
				taken[a] = true
				out = append(out, &networkingapi.ServiceEntryAddress{Value: a.String(), Host: host})
			}
		}
	}
	return out
}

// keeps reports whether se keeps an address it holds: it loses it to an
// entry that has it in spec.addresses (chosen by a user), or to an
// allocating entry that holds it in status and precedes se (the older, as
// istiod reassigns the newer of two entries given one address).
func keeps(se *networkingv1.ServiceEntry, a netip.Addr, holders Holders) bool {
	mine := claim(se)
	for _, h := range holders(a) {
		if same(h, se) {
			continue
		}
		if inSpec(h, a) {
			return false
		}
		if inStatus(h, a) && ambient.AutoAllocates(h) && claim(h).Precedes(mine) {
			return false
		}
	}
	return true
}

// next finds a free address of prefix p for host of se: from an offset
// hashed from the entry and host, the first address no entry holds and
// se has not taken; the invalid Addr when none is found. The prefix's
// first address, and an IPv4 prefix's last, are never used.
func next(se *networkingv1.ServiceEntry, host string, p netip.Prefix, taken map[netip.Addr]bool, holders Holders) netip.Addr {
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	lo, hi := uint64(1), ^uint64(0)
	if hostBits < 64 {
		hi = uint64(1)<<hostBits - 1
	}
	if p.Addr().Is4() {
		hi-- // the broadcast address
	}
	if hi < lo {
		return netip.Addr{}
	}
	span := hi - lo + 1 // lo is 1: no overflow
	h := fnv.New64a()
	_, _ = h.Write([]byte(se.Namespace + "/" + se.Name + "/" + host))
	off := lo + h.Sum64()%span
	for i := uint64(0); i < maxProbes && i < span; i++ {
		a := withOffset(p.Addr(), off)
		if !taken[a] && free(se, a, holders) {
			return a
		}
		if off == hi {
			off = lo
		} else {
			off++
		}
	}
	return netip.Addr{}
}

// withOffset sets the low 64 bits of a masked prefix address to off,
// which is below 2^(host bits), so no prefix bit changes.
func withOffset(base netip.Addr, off uint64) netip.Addr {
	if base.Is4() {
		b := base.As4()
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])|uint32(off))
		return netip.AddrFrom4(b)
	}
	b := base.As16()
	binary.BigEndian.PutUint64(b[8:], binary.BigEndian.Uint64(b[8:])|off)
	return netip.AddrFrom16(b)
}

// free reports whether no other entry holds a, in spec or in status
// (whether or not its status is still in use: it is cleared soon, and
// taking the address meanwhile would only cause a reassignment).
func free(se *networkingv1.ServiceEntry, a netip.Addr, holders Holders) bool {
	for _, h := range holders(a) {
		if !same(h, se) {
			return false
		}
	}
	return true
}

func claim(se *networkingv1.ServiceEntry) ambient.Claim {
	return ambient.Claim{Kind: ambient.KindServiceEntry, Namespace: se.Namespace, Name: se.Name, Created: se.CreationTimestamp.Time}
}

func same(a, b *networkingv1.ServiceEntry) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name
}

func inSpec(se *networkingv1.ServiceEntry, a netip.Addr) bool {
	for _, s := range se.Spec.GetAddresses() {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap() == a {
			return true
		}
	}
	return false
}

func inStatus(se *networkingv1.ServiceEntry, a netip.Addr) bool {
	for _, s := range se.Status.GetAddresses() {
		if ip, err := netip.ParseAddr(s.GetValue()); err == nil && ip.Unmap() == a {
			return true
		}
	}
	return false
}

// addresses lists every address an entry holds, for the holders index.
func addresses(se *networkingv1.ServiceEntry) []netip.Addr {
	var out []netip.Addr
	for _, s := range se.Spec.GetAddresses() {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	for _, s := range se.Status.GetAddresses() {
		if ip, err := netip.ParseAddr(s.GetValue()); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
