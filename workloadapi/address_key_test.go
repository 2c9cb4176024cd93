package workloadapi

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAddressKeyBuilders(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		got  string
		want string
	}{
		{"ipv4 default network", IPKey("", netip.MustParseAddr("10.1.2.3")), "/10.1.2.3"},
		{"ipv4", IPKey("net1", netip.MustParseAddr("10.1.2.3")), "net1/10.1.2.3"},
		{"ipv6", IPKey("net1", netip.MustParseAddr("2001:db8::1")), "net1/2001:db8::1"},
		{"cidr v4", CIDRKey("", netip.MustParsePrefix("10.96.0.0/16")), "/10.96.0.0/16"},
		{"cidr v6", CIDRKey("n", netip.MustParsePrefix("fd00::/64")), "n/fd00::/64"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestParseAddressKey(t *testing.T) {
	t.Parallel()
	v4 := netip.MustParseAddr("10.1.2.3")
	v6 := netip.MustParseAddr("2001:db8::1")
	for _, tt := range []struct {
		in      string
		want    AddressKey
		wantErr bool
	}{
		{in: "/10.1.2.3", want: AddressKey{Addr: v4}},
		{in: "net1/10.1.2.3", want: AddressKey{Network: "net1", Addr: v4}},
		{in: "net1/2001:db8::1", want: AddressKey{Network: "net1", Addr: v6}},
		{in: "/::ffff:10.1.2.3", want: AddressKey{Addr: netip.MustParseAddr("::ffff:10.1.2.3")}},
		{in: "/10.1.2.3/32", want: AddressKey{Addr: v4, Prefix: netip.PrefixFrom(v4, 32)}},
		{in: "n/10.96.0.0/0", want: AddressKey{Network: "n", Addr: netip.MustParseAddr("10.96.0.0"), Prefix: netip.MustParsePrefix("10.96.0.0/0")}},
		{in: "/2001:db8::1/128", want: AddressKey{Addr: v6, Prefix: netip.PrefixFrom(v6, 128)}},

		{in: "", wantErr: true},
		{in: "10.1.2.3", wantErr: true},
		{in: "net1/", wantErr: true},
		{in: "net1/10.1.2", wantErr: true},
		{in: "net1/010.1.2.3", wantErr: true},
		{in: "net1/2001:DB8::1", wantErr: true},
		{in: "net1/2001:db8:0::1", wantErr: true},
		{in: "net1/[2001:db8::1]", wantErr: true},
		{in: "net1/fe80::1%eth0", wantErr: true},
		{in: "net1/10.1.2.3/33", wantErr: true},
		{in: "net1/10.1.2.3/-1", wantErr: true},
		{in: "net1/10.1.2.3/08", wantErr: true},
		{in: "net1/10.1.2.3/", wantErr: true},
		{in: "net1/10.1.2.3/24/1", wantErr: true},
		{in: "a/b/10.1.2.3", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseAddressKey(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformedName) {
					t.Fatalf("ParseAddressKey(%q) = %+v, %v; want ErrMalformedName", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAddressKey(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("ParseAddressKey(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("String() = %q, want %q", s, tt.in)
			}
		})
	}
}

func TestAddrFromBytes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      []byte
		want    string
		wantErr bool
	}{
		{in: []byte{10, 1, 2, 3}, want: "10.1.2.3"},
		{in: netip.MustParseAddr("2001:db8::1").AsSlice(), want: "2001:db8::1"},
		{in: nil, wantErr: true},
		{in: []byte{1, 2, 3}, wantErr: true},
		{in: make([]byte, 5), wantErr: true},
	} {
		got, err := AddrFromBytes(tt.in)
		if tt.wantErr {
			if !errors.Is(err, ErrMalformedName) {
				t.Errorf("AddrFromBytes(%v) = %v, %v; want ErrMalformedName", tt.in, got, err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("AddrFromBytes(%v) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseAddressKey(f *testing.F) {
	for _, s := range []string{"/10.1.2.3", "net1/2001:db8::1", "/10.96.0.0/16", "n/fd00::/64", "/::ffff:1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseAddressKey(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedName) {
				t.Fatalf("error %v does not wrap ErrMalformedName", err)
			}
			return
		}
		if got := k.String(); got != s {
			t.Fatalf("ParseAddressKey(%q).String() = %q", s, got)
		}
		if k.IsCIDR() && k.Prefix.Addr() != k.Addr {
			t.Fatalf("prefix %v does not start at %v", k.Prefix, k.Addr)
		}
	})
}
