package bpfprog

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNewConfig(t *testing.T) {
	v4 := netip.MustParseAddr("10.1.2.3")
	v6 := netip.MustParseAddr("fd00::3")
	probe4 := netip.MustParseAddr("169.254.7.127")
	probe6 := netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
	for _, tc := range []struct {
		name           string
		pod4, pod6     netip.Addr
		probe4, probe6 netip.Addr
		dns            bool
		want           Config
		wantErr        bool
	}{
		{
			name: "dual stack with DNS", pod4: v4, pod6: v6, probe4: probe4, probe6: probe6, dns: true,
			want: Config{PodIPv4: v4.As4(), PodIPv6: v6.As16(), ProbeIPv4: probe4.As4(), ProbeIPv6: probe6.As16(), Flags: FlagDNSCapture},
		},
		{
			name: "IPv4 only without DNS", pod4: v4, probe4: probe4, probe6: probe6,
			want: Config{PodIPv4: v4.As4(), ProbeIPv4: probe4.As4(), ProbeIPv6: probe6.As16()},
		},
		{name: "IPv6 as pod IPv4", pod4: v6, wantErr: true},
		{name: "IPv4 as pod IPv6", pod6: v4, wantErr: true},
		{name: "v4-mapped pod IPv6", pod6: netip.MustParseAddr("::ffff:10.1.2.3"), wantErr: true},
		{name: "zoned probe IPv6", probe6: netip.MustParseAddr("fe80::1%eth0"), wantErr: true},
		{name: "IPv6 as probe IPv4", probe4: probe6, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewConfig(tc.pod4, tc.pod6, tc.probe4, tc.probe6, tc.dns)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NewConfig: error %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("NewConfig (-want +got):\n%s", diff)
			}
		})
	}
}
