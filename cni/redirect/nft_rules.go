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

var loopback = netip.MustParsePrefix("127.0.0.1/32")

const (
	tcp = l4proto(unix.IPPROTO_TCP)
	udp = l4proto(unix.IPPROTO_UDP)
)

// notProxy matches packets without the node proxy's mark.
var notProxy = mark{Not: true, Mask: MarkMask, Value: ProxyMark}

// nftRules returns the in-pod tables for cfg (wire contract §4.2 in the
// nftables form of §4.4).
func nftRules(cfg PodConfig) []nftTable {
	probe := netip.PrefixFrom(cfg.ProbeSNAT, 32)

	var pre []nftRule
	for _, i := range cfg.RerouteInterfaces {
		pre = append(pre,
			nftRule{ifname{Name: i}, tcp, redirect(OutboundPort)},
			nftRule{ifname{Name: i}, tcp, ret})
	}
	if cfg.InboundCapture {
		pre = append(pre,
			// Kubelet probes, SNATed on the host, skip capture.
			nftRule{tcp, ip4addr{Src: true, Prefix: probe}, accept},
			// All inbound TCP but HBONE goes to the plaintext listener.
			nftRule{tcp, ip4addr{Not: true, Prefix: loopback}, port{Proto: unix.IPPROTO_TCP, Not: true, Port: HBONEPort}, notProxy, redirect(InboundPort)})
	}
	out := []nftRule{
		nftRule{tcp, ip4addr{Prefix: probe}, accept},
	}
	if cfg.DNSCapture {
		out = append(out,
			nftRule{ifname{Out: true, Not: true, Name: "lo"}, udp, notProxy, port{Proto: unix.IPPROTO_UDP, Port: 53}, redirect(DNSPort)},
			nftRule{tcp, ip4addr{Not: true, Prefix: loopback}, port{Proto: unix.IPPROTO_TCP, Port: 53}, notProxy, redirect(DNSPort)})
	}
	out = append(out,
		// Replies of the proxy's connections are not captured.
		nftRule{tcp, mark{Mask: MarkMask, Value: TProxyMark}, accept},
		// The app talking to its own pod IP over lo is not captured.
		nftRule{ifname{Out: true, Name: "lo"}, ip4addr{Not: true, Prefix: loopback}, accept},
		// All other outbound TCP goes to the proxy.
		nftRule{tcp, ip4addr{Not: true, Prefix: loopback}, notProxy, redirect(OutboundPort)})

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
