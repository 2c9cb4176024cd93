package redirect

import (
	"net/netip"
	"testing"

	goldenpkg "github.com/canopy-mesh/canopy/internal/testing/golden"
)

var configs = map[string]PodConfig{
	"default":                DefaultPodConfig(),
	"no-dns":                 {InboundCapture: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},
	"bypass-inbound-capture": {DNSCapture: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},
	"reroute-interfaces":     {DNSCapture: true, InboundCapture: true, RerouteInterfaces: []string{"tap0", "k6t-eth0"}, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},

	"sidecar-default": {Sidecar: DefaultSidecarConfig()},
	"sidecar-ranges": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.IncludeOutbound = Ranges{Prefixes: prefixes("10.0.0.0/8", "fd00:10::/64", "192.168.0.0/16")}
		c.ExcludeOutbound = prefixes("2001:db8::/32", "10.96.0.0/12")
		c.IncludeOutboundPorts = []uint16{32000}
		c.ExcludeOutboundPorts = []uint16{9090, 15020}
	})},
	"sidecar-inbound-ports": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.IncludeInbound = Ports{Ports: []uint16{8080, 15021, 9090, 8081}}
		c.ExcludeInboundPorts = []uint16{8081, 15020}
	})},
	"sidecar-no-capture": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.IncludeInbound, c.IncludeOutbound = Ports{}, Ranges{}
	})},
	"sidecar-interfaces": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.RerouteInterfaces, c.ExcludeInterfaces = []string{"k6t-eth0", "tap0"}, []string{"eth1"}
	})},
	"sidecar-interfaces-ranges": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.RerouteInterfaces = []string{"k6t-eth0"}
		c.IncludeOutbound = Ranges{Prefixes: prefixes("10.0.0.0/8", "fd00:10::/64")}
	})},
	"sidecar-loopback-included": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.IncludeOutbound = Ranges{Prefixes: prefixes("127.0.0.0/8", "10.0.0.0/8")}
	})},
	"sidecar-dns": {Sidecar: sidecarWith(func(c *SidecarConfig) { c.DNSCapture = true })},
	"sidecar-owner-drop-invalid": {Sidecar: sidecarWith(func(c *SidecarConfig) {
		c.ProxyUID, c.ProxyGID, c.DropInvalid = 1000, 2000, true
	})},
}

// sidecarWith is the default sidecar configuration changed by f.
func sidecarWith(f func(*SidecarConfig)) *SidecarConfig {
	c := DefaultSidecarConfig()
	f(c)
	return c
}

func prefixes(ps ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func TestConfigsValid(t *testing.T) {
	t.Parallel()
	for name, cfg := range configs {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func golden(t *testing.T, name, got string) { t.Helper(); goldenpkg.Check(t, name, []byte(got)) }

func TestNftablesGolden(t *testing.T) {
	t.Parallel()
	for name, cfg := range configs {
		golden(t, "nftables-"+name+".golden", render(nftRules(cfg)))
	}
}

func TestIptablesGolden(t *testing.T) {
	t.Parallel()
	none := func(string, string) bool { return false }
	for name, cfg := range configs {
		golden(t, "iptables-"+name+".golden", restoreInput(iptRules(cfg, familyV4(cfg)), none, nil))
		golden(t, "ip6tables-"+name+".golden", restoreInput(iptRules(cfg, familyV6(cfg)), none, nil))
	}
}
