package xds

import "net/netip"

func netipParse(s string) ([]byte, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, err
	}
	return a.AsSlice(), nil
}
