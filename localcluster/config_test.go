package localcluster

import (
	"net/netip"
	"strings"
	"testing"
)

func validConfig() Config {
	return Config{Binaries: Binaries{Self: "/b/self", Echo: "/b/echo", KubeDir: "/b/kube", CoreDNS: "/b/coredns", CNIDir: "/b/cni"}}
}

func TestConfigDefaultsAndAddresses(t *testing.T) {
	t.Parallel()
	cfg, err := validConfig().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, got, want string }{
		{"state dir", cfg.StateDir, "/var/lib/canopy-local/canopy"},
		{"host", cfg.hostIP().String(), "10.99.0.1"},
		{"node 1", cfg.nodeIP(1).String(), "10.99.0.11"},
		{"node 2 pods", cfg.nodePodCIDR(2).String(), "10.244.2.0/24"},
		{"api VIP", cfg.apiServiceIP().String(), "10.96.0.1"},
		{"dns VIP", cfg.dnsServiceIP().String(), "10.96.0.10"},
		{"bridge", cfg.bridge(), "cnp-canopy"},
		{"zone of node 3", cfg.nodeZone(3), "zone-a"},
		{"netns", cfg.nodeNetns(2), "canopy-node-2"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, tt.got, tt.want)
		}
	}
	// Link names must fit the kernel's 15 characters for any cluster name.
	long := validConfig()
	long.Name = "abcdefghijk"
	long.Nodes = 200
	lc, err := long.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if l := lc.hostLink(200); len(l) > 15 || len(lc.bridge()) > 15 {
		t.Errorf("link names %q, %q longer than 15 characters", l, lc.bridge())
	}
	if lc.hostLink(1) == cfg.hostLink(1) {
		t.Error("two clusters share a host link name")
	}
}

func TestConfigRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"name too long", func(c *Config) { c.Name = "abcdefghijkl" }, "cluster name"},
		{"name upper case", func(c *Config) { c.Name = "Demo" }, "cluster name"},
		{"negative nodes", func(c *Config) { c.Nodes = -1 }, "nodes"},
		{"too many nodes", func(c *Config) { c.Nodes = 201 }, "nodes"},
		{"ipv6 underlay", func(c *Config) { c.Underlay = netip.MustParsePrefix("fd00::/64") }, "IPv4"},
		{"small pod cidr", func(c *Config) { c.PodCIDR = netip.MustParsePrefix("10.244.0.0/20") }, "pod CIDR"},
		{"relative binary", func(c *Config) { c.Binaries.Echo = "canopy-echo" }, "absolute"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := validConfig()
			tt.modify(&cfg)
			if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("withDefaults() error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}
