package redirect

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
)

// TestEbpfRules pins down the policy routing the eBPF backend installs,
// as `ip rule` prints it.
func TestEbpfRules(t *testing.T) {
	v4 := ebpfFamily{af: unix.AF_INET, all: netip.MustParsePrefix("0.0.0.0/0"), pod: netip.MustParseAddr("10.1.0.2"), probe: DefaultProbeSNAT}
	v6 := ebpfFamily{af: unix.AF_INET6, all: netip.MustParsePrefix("::/0"), pod: netip.MustParseAddr("fd00::2"), probe: DefaultProbeSNATv6}
	text := func(rules []fibRule) []string {
		var out []string
		for _, r := range rules {
			out = append(out, r.String())
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    ebpfFamily
		dns  bool
		want []string
	}{
		{"IPv4 with DNS capture", v4, true, []string{
			"ip rule 32000: to 169.254.7.127/32 lookup main",
			"ip rule 32001: fwmark 0x539/0xfff lookup main",
			"ip rule 32002: fwmark 0x539/0xfff unreachable",
			"ip rule 32003: iif lo ipproto tcp lookup 133",
			"ip rule 32004: iif lo ipproto udp dport 53 lookup 133",
		}},
		{"IPv6 without DNS capture", v6, false, []string{
			"ip -6 rule 32000: to fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128 lookup main",
			"ip -6 rule 32001: fwmark 0x539/0xfff lookup main",
			"ip -6 rule 32002: fwmark 0x539/0xfff unreachable",
			"ip -6 rule 32003: iif lo ipproto tcp lookup 133",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, text(tc.f.wantRules(tc.dns))); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiffBy(t *testing.T) {
	for _, tc := range []struct {
		name                string
		have, want          []string
		wantExtra, wantMiss []string
	}{
		{"equal", []string{"a", "b"}, []string{"b", "a"}, nil, nil},
		{"missing and extra", []string{"a", "x"}, []string{"a", "b"}, []string{"x"}, []string{"b"}},
		{"a duplicate is extra", []string{"a", "a"}, []string{"a"}, []string{"a"}, nil},
		{"nothing wanted", []string{"a"}, nil, []string{"a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra, missing := diffBy(tc.have, tc.want, func(s string) string { return s })
			if diff := cmp.Diff(tc.wantExtra, extra); diff != "" {
				t.Errorf("extra (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMiss, missing); diff != "" {
				t.Errorf("missing (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigProblems(t *testing.T) {
	mk := func(pod4 string, dns bool) bpfprog.Config {
		var a netip.Addr
		if pod4 != "" {
			a = netip.MustParseAddr(pod4)
		}
		c, err := bpfprog.NewConfig(a, netip.Addr{}, DefaultProbeSNAT, DefaultProbeSNATv6, dns)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name       string
		have, want bpfprog.Config
		problems   []string
	}{
		{"equal", mk("10.0.0.2", true), mk("10.0.0.2", true), nil},
		{"address and flag", mk("10.0.0.3", false), mk("10.0.0.2", true), []string{
			"cfg map: pod IPv4 is 10.0.0.3, want 10.0.0.2",
			"cfg map: DNS capture is off, want on",
		}},
		{"address gone", mk("10.0.0.3", true), mk("", true), []string{"cfg map: pod IPv4 is 10.0.0.3, want none"}},
		{"zeroed", bpfprog.Config{}, mk("10.0.0.2", false), []string{
			"cfg map: pod IPv4 is none, want 10.0.0.2",
			"cfg map: probe IPv4 is none, want 169.254.7.127",
			"cfg map: probe IPv6 is none, want fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.problems, configProblems(tc.have, tc.want)); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRemoveStaleDirs: directories named by an inode outside the live set
// go; those in it, and anything not named by an inode, stay. (Without
// pinned links, nothing marks a directory as a living pod's.)
func TestRemoveStaleDirs(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"100", "200", "300", "notes"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, d, "socks"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "400"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	removed, err := Ebpf{Root: root}.RemoveStaleDirs([]uint64{200})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if diff := cmp.Diff([]uint64{100, 300}, removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if diff := cmp.Diff([]string{"200", "400", "notes"}, left); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}

	if removed, err := (Ebpf{Root: filepath.Join(root, "missing")}).RemoveStaleDirs(nil); err != nil || removed != nil {
		t.Errorf("RemoveStaleDirs of a missing root = %v, %v; want nothing", removed, err)
	}
}
