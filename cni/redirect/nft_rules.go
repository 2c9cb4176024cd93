package redirect

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// Table names of the in-pod nftables rules (wire contract §4.4).
const (
	NatTable    = "istio-ambient-nat"
	MangleTable = "istio-ambient-mangle"
	RawTable    = "istio-ambient-raw"
)

// family is what an address match differs in between IPv4 and IPv6.
type family struct {
	loopback, probe netip.Prefix
}

func familyV4(cfg PodConfig) family {
	return family{loopback: netip.MustParsePrefix("127.0.0.1/32"), probe: netip.PrefixFrom(cfg.ProbeSNAT, 32)}
}

func familyV6(cfg PodConfig) family {
	return family{loopback: netip.MustParsePrefix("::1/128"), probe: netip.PrefixFrom(cfg.ProbeSNATv6, 128)}
}

// families are IPv4 then IPv6. Every rule that matches an address comes
// in twins, one per family, so IPv6 TCP is captured exactly as IPv4 is
// (wire contract §4.2: "for IPv6 the same rules are installed with ::1/128
// and the v6 SNAT address"). They are always both installed: an inet table
// takes IPv6 rules even where the pod has no IPv6, and a pod that gains an
// address later is covered without a new enrollment.
func families(cfg PodConfig) []family { return []family{familyV4(cfg), familyV6(cfg)} }

// perFamily returns rule's twins.
func perFamily(cfg PodConfig, rule func(family) nftRule) []nftRule {
	var out []nftRule
	for _, f := range families(cfg) {
		out = append(out, rule(f))
	}
	return out
}

const (
	tcp = l4proto(unix.IPPROTO_TCP)
	udp = l4proto(unix.IPPROTO_UDP)
)

// notProxy matches packets without the node proxy's mark.
var notProxy = mark{Not: true, Mask: MarkMask, Value: ProxyMark}

// nftRules returns the in-pod tables for cfg (wire contract §4.2 in the
// nftables form of §4.4).
func nftRules(cfg PodConfig) []nftTable {
	if cfg.Sidecar != nil {
		return nftSidecarRules(cfg.Sidecar)
	}
	var pre []nftRule
	for _, i := range cfg.RerouteInterfaces {
		pre = append(pre,
			nftRule{ifname{Name: i}, tcp, redirect(OutboundPort)},
			nftRule{ifname{Name: i}, tcp, ret})
	}
	if cfg.InboundCapture {
		// Kubelet probes, SNATed on the host, skip capture.
		pre = append(pre, perFamily(cfg, func(f family) nftRule {
			return nftRule{tcp, ipaddr{Src: true, Prefix: f.probe}, accept}
		})...)
		// All inbound TCP but HBONE goes to the plaintext listener.
		pre = append(pre, perFamily(cfg, func(f family) nftRule {
			return nftRule{tcp, ipaddr{Not: true, Prefix: f.loopback}, port{Proto: unix.IPPROTO_TCP, Not: true, Port: HBONEPort}, notProxy, redirect(InboundPort)}
		})...)
	}
	out := perFamily(cfg, func(f family) nftRule { return nftRule{tcp, ipaddr{Prefix: f.probe}, accept} })
	if cfg.DNSCapture {
		// UDP DNS matches no address: one rule serves both families.
		out = append(out, nftRule{ifname{Out: true, Not: true, Name: "lo"}, udp, notProxy, port{Proto: unix.IPPROTO_UDP, Port: 53}, redirect(DNSPort)})
		out = append(out, perFamily(cfg, func(f family) nftRule {
			return nftRule{tcp, ipaddr{Not: true, Prefix: f.loopback}, port{Proto: unix.IPPROTO_TCP, Port: 53}, notProxy, redirect(DNSPort)}
		})...)
	}
	// Replies of the proxy's connections are not captured.
	out = append(out, nftRule{tcp, mark{Mask: MarkMask, Value: TProxyMark}, accept})
	// The app talking to its own pod IP over lo is not captured.
	out = append(out, perFamily(cfg, func(f family) nftRule {
		return nftRule{ifname{Out: true, Name: "lo"}, ipaddr{Not: true, Prefix: f.loopback}, accept}
	})...)
	// All other outbound TCP goes to the proxy.
	out = append(out, perFamily(cfg, func(f family) nftRule {
		return nftRule{tcp, ipaddr{Not: true, Prefix: f.loopback}, notProxy, redirect(OutboundPort)}
	})...)

	tables := []nftTable{
		{Name: MangleTable, Chains: []nftChain{
			{Name: "prerouting", Hook: &nftHook{"filter", "prerouting", -150}, Rules: []nftRule{
				{mark{Mask: MarkMask, Value: ProxyMark}, connmarkFromMark{Mask: MarkMask, Value: TProxyMark}},
			}},
			{Name: "output", Hook: &nftHook{"route", "output", -150}, Rules: []nftRule{
				{mark{Ct: true, Mask: MarkMask, Value: TProxyMark}, markFromConnmark{}},
			}},
		}},
		{Name: NatTable, Chains: []nftChain{
			{Name: "prerouting", Hook: &nftHook{"nat", "prerouting", -100}, Rules: []nftRule{{jump("istio-prerouting")}}},
			{Name: "output", Hook: &nftHook{"nat", "output", -100}, Rules: []nftRule{{jump("istio-output")}}},
			{Name: "istio-prerouting", Rules: pre},
			{Name: "istio-output", Rules: out},
		}},
	}
	if cfg.DNSCapture {
		// The proxy's upstream DNS and its replies get their own conntrack
		// zone, apart from the app's redirected queries.
		tables = append(tables, nftTable{Name: RawTable, Chains: []nftChain{
			{Name: "prerouting", Hook: &nftHook{"filter", "prerouting", -300}, Rules: []nftRule{
				{udp, notProxy, port{Proto: unix.IPPROTO_UDP, Src: true, Port: 53}, ctZone(1)},
			}},
			{Name: "output", Hook: &nftHook{"filter", "output", -300}, Rules: []nftRule{
				{udp, mark{Mask: MarkMask, Value: ProxyMark}, port{Proto: unix.IPPROTO_UDP, Port: 53}, ctZone(1)},
			}},
		}})
	}
	return tables
}
