package redirect

import (
	"fmt"
	"strings"
)

// iptables chains of wire contract §4.2.
const (
	preChain = "ISTIO_PRERT"
	outChain = "ISTIO_OUTPUT"
)

// iptTable is one table's chains and rules, each rule written the way
// iptables-save prints it, so Verify compares text with text.
type iptTable struct {
	Name string
	// Chains are our chains of the table, declared (and so flushed) first.
	Chains []string
	// Jumps are the rules in built-in chains, e.g. "-A PREROUTING -j ISTIO_PRERT".
	Jumps []string
	// Rules are the rules of our chains, in order.
	Rules []string
}

// iptRules are the tables of one family: iptables takes familyV4,
// ip6tables familyV6, with the same rules but for the loopback and probe
// addresses.
func iptRules(cfg PodConfig, f family) []iptTable {
	if cfg.Sidecar != nil {
		return iptSidecarRules(cfg.Sidecar, f.loopback.Addr().Is6())
	}
	probe, loopback := f.probe.String(), f.loopback.String()
	notProxy := fmt.Sprintf("-m mark ! --mark 0x%x/0x%x", ProxyMark, MarkMask)
	jumps := []string{"-A PREROUTING -j " + preChain, "-A OUTPUT -j " + outChain}

	var nat []string
	for _, i := range cfg.RerouteInterfaces {
		nat = append(nat,
			fmt.Sprintf("-A %s -i %s -p tcp -j REDIRECT --to-ports %d", preChain, i, OutboundPort),
			fmt.Sprintf("-A %s -i %s -p tcp -j RETURN", preChain, i))
	}
	if cfg.InboundCapture {
		nat = append(nat,
			fmt.Sprintf("-A %s -s %s -p tcp -m tcp -j ACCEPT", preChain, probe),
			fmt.Sprintf("-A %s ! -d %s -p tcp -m tcp ! --dport %d %s -j REDIRECT --to-ports %d", preChain, loopback, HBONEPort, notProxy, InboundPort))
	}
	nat = append(nat, fmt.Sprintf("-A %s -d %s -p tcp -m tcp -j ACCEPT", outChain, probe))
	if cfg.DNSCapture {
		nat = append(nat,
			fmt.Sprintf("-A %s ! -o lo -p udp %s -m udp --dport 53 -j REDIRECT --to-ports %d", outChain, notProxy, DNSPort),
			fmt.Sprintf("-A %s ! -d %s -p tcp -m tcp --dport 53 %s -j REDIRECT --to-ports %d", outChain, loopback, notProxy, DNSPort))
	}
	nat = append(nat,
		fmt.Sprintf("-A %s -p tcp -m mark --mark 0x%x/0x%x -j ACCEPT", outChain, TProxyMark, MarkMask),
		fmt.Sprintf("-A %s ! -d %s -o lo -j ACCEPT", outChain, loopback),
		fmt.Sprintf("-A %s ! -d %s -p tcp %s -j REDIRECT --to-ports %d", outChain, loopback, notProxy, OutboundPort))

	chains := []string{preChain, outChain}
	tables := []iptTable{
		{Name: "mangle", Chains: chains, Jumps: jumps, Rules: []string{
			fmt.Sprintf("-A %s -m mark --mark 0x%x/0x%x -j CONNMARK --set-xmark 0x%x/0x%x", preChain, ProxyMark, MarkMask, TProxyMark, MarkMask),
			fmt.Sprintf("-A %s -m connmark --mark 0x%x/0x%x -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff", outChain, TProxyMark, MarkMask),
		}},
		{Name: "nat", Chains: chains, Jumps: jumps, Rules: nat},
	}
	if cfg.DNSCapture {
		tables = append(tables, iptTable{Name: "raw", Chains: chains, Jumps: jumps, Rules: []string{
			fmt.Sprintf("-A %s -p udp -m mark ! --mark 0x%x/0x%x -m udp --sport 53 -j CT --zone 1", preChain, ProxyMark, MarkMask),
			fmt.Sprintf("-A %s -p udp -m mark --mark 0x%x/0x%x -m udp --dport 53 -j CT --zone 1", outChain, ProxyMark, MarkMask),
		}})
	}
	return tables
}

// restoreInput renders tables for iptables-restore --noflush. Declaring
// our chains flushes them; jumps already present (per present) are not
// added twice. cleanup holds, per table, lines that go between the
// declarations and the rules (removals of what the table no longer has).
func restoreInput(tables []iptTable, present func(table, rule string) bool, cleanup map[string][]string) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "*%s\n", t.Name)
		for _, c := range t.Chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, l := range cleanup[t.Name] {
			b.WriteString(l + "\n")
		}
		for _, j := range t.Jumps {
			if !present(t.Name, j) {
				b.WriteString(j + "\n")
			}
		}
		for _, r := range t.Rules {
			b.WriteString(r + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
