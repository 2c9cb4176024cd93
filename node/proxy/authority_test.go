package proxy

import (
	"net/netip"
	"testing"
)

func TestParseAuthority(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want string
	}{
		{"10.244.1.5:8080", "10.244.1.5:8080"},
		{"[fd00::5]:80", "[fd00::5]:80"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1:80"},
		{"web.apps.svc.cluster.local:80", ""},
		{"10.244.1.5", ""},
		{"10.244.1.5:0", ""},
		{"10.244.1.5:65536", ""},
		{"10.244.1.5:http", ""},
		{"[fe80::1%eth0]:80", ""},
		{"", ""},
	} {
		got, err := parseAuthority(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("parseAuthority(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("parseAuthority(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseAuthority(f *testing.F) {
	f.Add("10.244.1.5:8080")
	f.Add("[fd00::5]:80")
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := parseAuthority(s)
		if err != nil {
			return
		}
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Is4In6() {
			t.Fatalf("parseAuthority(%q) = %v", s, ap)
		}
		if back, err := netip.ParseAddrPort(ap.String()); err != nil || back != ap {
			t.Fatalf("round trip of %v: %v, %v", ap, back, err)
		}
	})
}
