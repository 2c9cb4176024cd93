package workloadapi

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// AddressKey is a parsed "<network>/<ip>" key: the alias under which a
// workload or service is looked up by IP, and the key of on-demand lookups.
// A CIDR VIP's key is "<network>/<ip>/<prefix length>". The network is empty
// on the default network, so "/10.1.2.3" is a valid key.
type AddressKey struct {
	Network string
	Addr    netip.Addr
	// Prefix is valid only for a CIDR VIP key; then Prefix.Addr() == Addr.
	Prefix netip.Prefix
}

// IPKey returns the key of a host address.
func IPKey(network string, addr netip.Addr) string {
	return AddressKey{Network: network, Addr: addr}.String()
}

// CIDRKey returns the key of a CIDR VIP.
func CIDRKey(network string, prefix netip.Prefix) string {
	return AddressKey{Network: network, Addr: prefix.Addr(), Prefix: prefix}.String()
}

// IsCIDR reports whether k names a CIDR VIP rather than a host address.
func (k AddressKey) IsCIDR() bool { return k.Prefix.IsValid() }

// String returns the key in its wire format.
func (k AddressKey) String() string {
	if k.IsCIDR() {
		return k.Network + "/" + k.Prefix.Addr().String() + "/" + strconv.Itoa(k.Prefix.Bits())
	}
	return k.Network + "/" + k.Addr.String()
}

// ParseAddressKey parses "<network>/<ip>" or "<network>/<ip>/<prefix length>".
// The IP must be in canonical form (as net/netip prints it, IPv6 without
// brackets or zone), because keys are compared as strings: a lookup for
// "/::FFFF:1.2.3.4" would otherwise miss "/::ffff:1.2.3.4".
func ParseAddressKey(key string) (AddressKey, error) {
	k, err := parseAddressKey(key)
	if err != nil {
		return AddressKey{}, fmt.Errorf("%w: address key %q: %w", ErrMalformedName, key, err)
	}
	return k, nil
}

func parseAddressKey(key string) (AddressKey, error) {
	network, rest, ok := strings.Cut(key, "/")
	if !ok {
		return AddressKey{}, fmt.Errorf("want <network>/<ip>")
	}
	ip, bits, cidr := strings.Cut(rest, "/")
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return AddressKey{}, fmt.Errorf("parse ip: %w", err)
	}
	if addr.Zone() != "" {
		return AddressKey{}, fmt.Errorf("ip %q has a zone", ip)
	}
	if addr.String() != ip {
		return AddressKey{}, fmt.Errorf("ip %q is not in canonical form %q", ip, addr.String())
	}
	k := AddressKey{Network: network, Addr: addr}
	if !cidr {
		return k, nil
	}
	n, err := strconv.Atoi(bits)
	if err != nil || strconv.Itoa(n) != bits || n < 0 || n > addr.BitLen() {
		return AddressKey{}, fmt.Errorf("prefix length %q is not a number from 0 to %d", bits, addr.BitLen())
	}
	k.Prefix = netip.PrefixFrom(addr, n)
	return k, nil
}

// AddrFromBytes converts a raw address of the protocol (Workload.addresses,
// NetworkAddress.address) to a netip.Addr: 4 bytes are IPv4, 16 bytes IPv6.
func AddrFromBytes(b []byte) (netip.Addr, error) {
	addr, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: address of %d bytes, want 4 or 16", ErrMalformedName, len(b))
	}
	return addr, nil
}
