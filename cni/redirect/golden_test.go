package redirect

import (
	"testing"

	goldenpkg "github.com/canopy-mesh/canopy/internal/testing/golden"
)

var configs = map[string]PodConfig{
	"default":                DefaultPodConfig(),
	"no-dns":                 {InboundCapture: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},
	"bypass-inbound-capture": {DNSCapture: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},
	"reroute-interfaces":     {DNSCapture: true, InboundCapture: true, RerouteInterfaces: []string{"tap0", "k6t-eth0"}, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6},
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
		golden(t, "iptables-"+name+".golden", restoreInput(iptRules(cfg, familyV4(cfg)), none))
		golden(t, "ip6tables-"+name+".golden", restoreInput(iptRules(cfg, familyV6(cfg)), none))
	}
}
