package redirect

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var configs = map[string]PodConfig{
	"default":                DefaultPodConfig(),
	"no-dns":                 {InboundCapture: true, ProbeSNAT: DefaultProbeSNAT},
	"bypass-inbound-capture": {DNSCapture: true, ProbeSNAT: DefaultProbeSNAT},
	"reroute-interfaces":     {DNSCapture: true, InboundCapture: true, RerouteInterfaces: []string{"tap0", "k6t-eth0"}, ProbeSNAT: DefaultProbeSNAT},
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

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
		golden(t, "iptables-"+name+".golden", restoreInput(iptRules(cfg), none))
	}
}
