package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// conf is a Config with glibc's defaults and the given nameservers.
func conf(ns ...string) Config {
	c := Config{Ndots: 1, Timeout: 5 * time.Second, Attempts: 2}
	for _, s := range ns {
		c.Nameservers = append(c.Nameservers, netip.MustParseAddr(s))
	}
	return c
}

func with(c Config, f func(*Config)) Config { f(&c); return c }

func TestParse(t *testing.T) {
	t.Parallel()
	var many strings.Builder
	many.WriteString("nameserver 10.0.0.1\nsearch")
	for i := range MaxSearch + 5 {
		fmt.Fprintf(&many, " d%d.example", i)
	}
	var manyWant []string
	for i := range MaxSearch {
		manyWant = append(manyWant, fmt.Sprintf("d%d.example", i))
	}
	for _, tt := range []struct {
		name string
		in   string
		want Config
	}{
		{
			name: "kubernetes ClusterFirst",
			in:   "search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
			want: with(conf("10.96.0.10"), func(c *Config) {
				c.Search = []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"}
				c.Ndots = 5
			}),
		},
		{
			name: "only the first three nameservers",
			in:   "nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nnameserver 10.0.0.4\n",
			want: conf("10.0.0.1", "10.0.0.2", "10.0.0.3"),
		},
		{
			name: "a bad address takes no place",
			in:   "nameserver bogus\nnameserver 300.1.1.1\nnameserver 1.2.3.4%eth0\nnameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n",
			want: conf("10.0.0.1", "10.0.0.2", "10.0.0.3"),
		},
		{
			name: "text after the address is ignored",
			in:   "nameserver 10.0.0.1 # the cluster resolver\nnameserver\t10.0.0.2\textra\n",
			want: conf("10.0.0.1", "10.0.0.2"),
		},
		{
			name: "IPv6 with and without zone",
			in:   "nameserver fe80::1%eth0\nnameserver 2001:db8::53\nnameserver ::ffff:192.0.2.1\n",
			want: conf("fe80::1%eth0", "2001:db8::53", "::ffff:192.0.2.1"),
		},
		{
			name: "keywords count only at the start of a line and followed by a blank",
			in:   " nameserver 10.0.0.9\n\tnameserver 10.0.0.8\nnameserver10.0.0.7\nNAMESERVER 10.0.0.6\nnameserver 10.0.0.1\n",
			want: conf("10.0.0.1"),
		},
		{
			name: "comments and garbage",
			in:   "#nameserver 10.0.0.9\n;nameserver 10.0.0.8\nsortlist 10.0.0.0/8\nlorem ipsum\n\n\x01\xff\nnameserver 10.0.0.1",
			want: conf("10.0.0.1"),
		},
		{
			name: "CRLF line ends",
			in:   "nameserver 10.0.0.1\r\nsearch a.example\r\noptions ndots:3\r\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Search = []string{"a.example"}; c.Ndots = 3 }),
		},
		{
			name: "a NUL ends the line",
			in:   "nameserver 10.0.0.1\x00nameserver 10.0.0.9\n\x00nameserver 10.0.0.8\nnameserver 10.0.0.2\n",
			want: conf("10.0.0.1", "10.0.0.2"),
		},
		{
			name: "the last search or domain line wins",
			in:   "nameserver 10.0.0.1\nsearch a.example b.example\ndomain c.example d.example\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Search = []string{"c.example"} }),
		},
		{
			name: "an empty search line changes nothing",
			in:   "nameserver 10.0.0.1\nsearch a.example\nsearch \ndomain\t\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Search = []string{"a.example"} }),
		},
		{
			name: "search names normalised, non-host names dropped",
			in:   "nameserver 10.0.0.1\nsearch NS1.Svc.Cluster.Local. # bad..name -x_y.example . " + strings.Repeat("a", 64) + ".example\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Search = []string{"ns1.svc.cluster.local", "-x_y.example"} }),
		},
		{
			name: "search list capped",
			in:   many.String(),
			want: with(conf("10.0.0.1"), func(c *Config) { c.Search = manyWant }),
		},
		{
			name: "options clamped as glibc does",
			in:   "nameserver 10.0.0.1\noptions ndots:20 timeout:100 attempts:9\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Ndots = 15; c.Timeout = 30 * time.Second; c.Attempts = 5 }),
		},
		{
			name: "zero options raised to a usable minimum",
			in:   "nameserver 10.0.0.1\noptions ndots:0 timeout:0 attempts:0\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Ndots = 0; c.Timeout = time.Second; c.Attempts = 1 }),
		},
		{
			name: "option values read as atoi does, others ignored",
			in:   "nameserver 10.0.0.1\noptions ndots:3x timeout:-1 attempts: rotate edns0 single-request ndots timeout:99999999999999999999\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Ndots = 3; c.Timeout = 30 * time.Second }),
		},
		{
			name: "later options lines override",
			in:   "options ndots:2\nnameserver 10.0.0.1\noptions ndots:4 attempts:3\n",
			want: with(conf("10.0.0.1"), func(c *Config) { c.Ndots = 4; c.Attempts = 3 }),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse([]byte(tt.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	big := append([]byte("nameserver 10.0.0.1\n"), bytes.Repeat([]byte("#"), MaxResolvConfSize)...)
	for _, tt := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrNoNameserver},
		{"comments only", []byte("# nameserver 10.0.0.1\n; nameserver 10.0.0.2\n"), ErrNoNameserver},
		{"no usable address", []byte("nameserver\nnameserver localhost\nnameserver 10.0.0.1/8\nsearch a.example\n"), ErrNoNameserver},
		{"over 64 KiB", big, ErrTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tt.in)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse = %+v, %v; want error %v", got, err, tt.want)
			}
		})
	}
	// The limit itself is allowed.
	if _, err := Parse(big[:MaxResolvConfSize]); err != nil {
		t.Errorf("Parse of exactly %d bytes: %v", MaxResolvConfSize, err)
	}
}

func TestUpstreams(t *testing.T) {
	t.Parallel()
	got := conf("10.0.0.1", "fe80::1%eth0").Upstreams()
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:53"), netip.MustParseAddrPort("[fe80::1%eth0]:53")}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("Upstreams mismatch (-want +got):\n%s", diff)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"nameserver 10.96.0.10\nsearch ns.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
		"nameserver fe80::1%eth0\nnameserver 10.0.0.1 x\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n",
		"domain example.com\noptions timeout:0 attempts:100 ndots:99\nnameserver 1.1.1.1\r\n",
		"nameserver 1.1.1.1\x00\nsearch A.B. c..d\n#x\n;y\noptions ndots:",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if len(b) > MaxResolvConfSize {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Parse of %d bytes: err %v, want ErrTooLarge", len(b), err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, ErrNoNameserver) {
				t.Fatalf("Parse: unexpected error %v", err)
			}
			return
		}
		if n := len(c.Nameservers); n < 1 || n > MaxNameservers {
			t.Errorf("%d nameservers", n)
		}
		for _, a := range c.Nameservers {
			if !a.IsValid() || (a.Is4() && a.Zone() != "") {
				t.Errorf("nameserver %v", a)
			}
		}
		if len(c.Search) > MaxSearch {
			t.Errorf("%d search names", len(c.Search))
		}
		for _, s := range c.Search {
			if !isHostName(s) || s != strings.ToLower(s) {
				t.Errorf("search name %q", s)
			}
		}
		if c.Ndots < 0 || c.Ndots > MaxNdots {
			t.Errorf("ndots %d", c.Ndots)
		}
		if c.Timeout < time.Second || c.Timeout > MaxTimeout || c.Timeout%time.Second != 0 {
			t.Errorf("timeout %v", c.Timeout)
		}
		if c.Attempts < 1 || c.Attempts > MaxAttempts {
			t.Errorf("attempts %d", c.Attempts)
		}
		// A comment line glibc ignores changes nothing.
		if len(b)+3 <= MaxResolvConfSize {
			again, err := Parse(append(append([]byte(nil), b...), "\n#x"...))
			if err != nil {
				t.Fatalf("Parse with a comment appended: %v", err)
			}
			if diff := cmp.Diff(c, again, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("appending a comment line changed the result (-before +after):\n%s", diff)
			}
		}
	})
}
