package redirect

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// The policy routing of the eBPF backend (docs: cni/README.md, "eBPF
// backend"). sk_lookup only runs for packets the kernel delivers locally,
// so the pod's outbound TCP (and DNS over UDP, when captured) is routed
// `local` through EbpfRouteTable; the node proxy's marked sockets, and
// replies to kubelet probes, keep the main table.
//
//	pref 32000  to <probe address> lookup main
//	pref 32001  fwmark 0x539/0xfff lookup main
//	pref 32002  fwmark 0x539/0xfff unreachable
//	pref 32003  iif lo ipproto tcp lookup 133
//	pref 32004  iif lo ipproto udp dport 53 lookup 133   (DNS capture only)
//	table 133:  local 0.0.0.0/0 dev lo src <pod IPv4>    (::/0 and the pod IPv6 for IPv6)
//	            local fe80::/10 dev <interface> metric <ifindex>   (IPv6, per interface)
//
// "iif lo" matches every locally generated packet (output lookups take lo
// as their input interface) and packets looped back over lo, never
// packets that arrive from outside, so foreign destinations arriving on
// the pod's interfaces are not turned into local deliveries. The app's
// replies to the proxy's connections that spoof the client's address are
// routed local by 32003 as well, and so reach the proxy's socket without
// connmark.
//
// 32002 is kept: "lookup main" falls through to the next rule when the
// main table has no route for the destination (a pod without a default
// route for a family, or a throw route). Without 32002 the proxy's own
// marked connection would then fall into 32003, be delivered locally and
// be steered back into the proxy's 15001 listener, a loop; with it the
// proxy gets ENETUNREACH, as it would without any capture
// (TestEbpfMarkedWithoutRouteUnreachable).
const (
	// EbpfRouteTable delivers every destination locally, so that
	// sk_lookup can steer the connection to a proxy socket.
	EbpfRouteTable = 133

	// EbpfRulePriorityProbe keeps replies to kubelet probes (addressed
	// to the probe SNAT address) on the main table.
	EbpfRulePriorityProbe = 32000
	// EbpfRulePriorityProxy keeps the proxy's marked packets on the main
	// table.
	EbpfRulePriorityProxy = 32001
	// EbpfRulePriorityProxyUnreachable stops marked packets the main
	// table has no route for from falling into the capture rules.
	EbpfRulePriorityProxyUnreachable = 32002
	// EbpfRulePriorityTCP sends locally originated TCP to EbpfRouteTable.
	EbpfRulePriorityTCP = 32003
	// EbpfRulePriorityDNS sends locally originated UDP to port 53 to
	// EbpfRouteTable, with DNS capture only.
	EbpfRulePriorityDNS = 32004

	ebpfRulePriorityFirst = EbpfRulePriorityProbe
	ebpfRulePriorityLast  = EbpfRulePriorityDNS
)

// fibRule is a policy routing rule as far as the eBPF backend tells rules
// apart: everything `ip rule` prints for the selectors and actions the
// kernel reports. Rules are compared by String.
type fibRule struct {
	family   int
	priority int
	invert   bool
	src, dst netip.Prefix
	tos      uint8
	iif, oif string
	mark     uint32
	mask     *uint32
	ipproto  uint8
	sport    *netlink.RulePortRange
	dport    *netlink.RulePortRange
	uidRange *netlink.RuleUIDRange
	l3mdev   bool
	// action is FR_ACT_* (the rule header's action), table the table of
	// FR_ACT_TO_TBL, gotoPrio the target of FR_ACT_GOTO.
	action   uint8
	table    int
	gotoPrio int
	// suppressPrefixlen and suppressIfgroup are -1 when unset.
	suppressPrefixlen, suppressIfgroup int
}

// Actions of struct fib_rule_hdr (uapi/linux/fib_rules.h); they share the
// values of the route types netlink.Rule.Type takes.
const (
	frActToTable     = unix.RTN_UNICAST // FR_ACT_TO_TBL
	frActGoto        = 2                // FR_ACT_GOTO
	frActNop         = 3                // FR_ACT_NOP
	frActBlackhole   = unix.RTN_BLACKHOLE
	frActUnreachable = unix.RTN_UNREACHABLE
	frActProhibit    = unix.RTN_PROHIBIT
)

func (r fibRule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s rule %d:", familyName(r.family), r.priority)
	if r.invert {
		b.WriteString(" not")
	}
	if r.src.IsValid() {
		fmt.Fprintf(&b, " from %s", r.src)
	}
	if r.dst.IsValid() {
		fmt.Fprintf(&b, " to %s", r.dst)
	}
	if r.tos != 0 {
		fmt.Fprintf(&b, " tos 0x%x", r.tos)
	}
	if r.mark != 0 || r.mask != nil {
		fmt.Fprintf(&b, " fwmark 0x%x", r.mark)
		if r.mask != nil {
			fmt.Fprintf(&b, "/0x%x", *r.mask)
		}
	}
	if r.iif != "" {
		fmt.Fprintf(&b, " iif %s", r.iif)
	}
	if r.oif != "" {
		fmt.Fprintf(&b, " oif %s", r.oif)
	}
	if r.uidRange != nil {
		fmt.Fprintf(&b, " uidrange %d-%d", r.uidRange.Start, r.uidRange.End)
	}
	if r.l3mdev {
		b.WriteString(" l3mdev")
	}
	switch r.ipproto {
	case 0:
	case unix.IPPROTO_TCP:
		b.WriteString(" ipproto tcp")
	case unix.IPPROTO_UDP:
		b.WriteString(" ipproto udp")
	default:
		fmt.Fprintf(&b, " ipproto %d", r.ipproto)
	}
	for _, p := range []struct {
		name string
		r    *netlink.RulePortRange
	}{{"sport", r.sport}, {"dport", r.dport}} {
		switch {
		case p.r == nil:
		case p.r.Start == p.r.End:
			fmt.Fprintf(&b, " %s %d", p.name, p.r.Start)
		default:
			fmt.Fprintf(&b, " %s %d-%d", p.name, p.r.Start, p.r.End)
		}
	}
	switch r.action {
	case frActToTable:
		switch r.table {
		case unix.RT_TABLE_MAIN:
			b.WriteString(" lookup main")
		case unix.RT_TABLE_LOCAL:
			b.WriteString(" lookup local")
		default:
			fmt.Fprintf(&b, " lookup %d", r.table)
		}
	case frActGoto:
		fmt.Fprintf(&b, " goto %d", r.gotoPrio)
	case frActNop:
		b.WriteString(" nop")
	case frActBlackhole:
		b.WriteString(" blackhole")
	case frActUnreachable:
		b.WriteString(" unreachable")
	case frActProhibit:
		b.WriteString(" prohibit")
	default:
		fmt.Fprintf(&b, " action %d", r.action)
	}
	if r.suppressPrefixlen >= 0 {
		fmt.Fprintf(&b, " suppress_prefixlength %d", r.suppressPrefixlen)
	}
	if r.suppressIfgroup >= 0 {
		fmt.Fprintf(&b, " suppress_ifgroup %d", r.suppressIfgroup)
	}
	return b.String()
}

func familyName(af int) string {
	if af == unix.AF_INET6 {
		return "ip -6"
	}
	return "ip"
}

// netlinkRule is r in the form netlink.Handle.RuleAdd and RuleDel take;
// every selector r has is set, so a RuleDel removes this rule and no
// other.
func (r fibRule) netlinkRule() *netlink.Rule {
	n := netlink.NewRule()
	n.Family, n.Priority, n.Invert = r.family, r.priority, r.invert
	if r.src.IsValid() {
		n.Src = prefixNet(r.src)
	}
	if r.dst.IsValid() {
		n.Dst = prefixNet(r.dst)
	}
	n.Tos, n.IifName, n.OifName = uint(r.tos), r.iif, r.oif
	n.Mark, n.Mask = r.mark, r.mask
	n.IPProto, n.Sport, n.Dport, n.UIDRange = int(r.ipproto), r.sport, r.dport, r.uidRange
	n.Type = r.action
	switch r.action {
	case frActToTable:
		n.Table = r.table
	case frActGoto:
		n.Goto = r.gotoPrio
	}
	n.SuppressPrefixlen, n.SuppressIfgroup = r.suppressPrefixlen, r.suppressIfgroup
	return n
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// listEbpfRules dumps the rules of family af whose priority is in the eBPF
// backend's range, in the netns at path. The netlink package's RuleList
// does not report a rule's action, which tells "lookup main" from
// "unreachable", so the dump is parsed here.
func listEbpfRules(path string, af int) ([]fibRule, error) {
	var msgs [][]byte
	err := netns.Do(path, func() error {
		req := nl.NewNetlinkRequest(unix.RTM_GETRULE, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfInfomsg(af))
		var err error
		msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWRULE)
		return err
	})
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s rules in %s: %w", familyName(af), path, err)
	}
	var out []fibRule
	for _, m := range msgs {
		r, err := parseFibRule(m)
		if err != nil {
			return nil, fmt.Errorf("list %s rules in %s: %w", familyName(af), path, err)
		}
		if r.family == af && r.priority >= ebpfRulePriorityFirst && r.priority <= ebpfRulePriorityLast {
			out = append(out, r)
		}
	}
	return out, nil
}

// parseFibRule decodes one RTM_NEWRULE message: struct fib_rule_hdr, then
// FRA_* attributes.
func parseFibRule(m []byte) (fibRule, error) {
	hdr := nl.DeserializeRtMsg(m)
	r := fibRule{
		family: int(hdr.Family), tos: hdr.Tos, table: int(hdr.Table), action: hdr.Type,
		invert: hdr.Flags&netlink.FibRuleInvert != 0, suppressPrefixlen: -1, suppressIfgroup: -1,
	}
	attrs, err := nl.ParseRouteAttr(m[hdr.Len():])
	if err != nil {
		return fibRule{}, err
	}
	u32 := func(v []byte) uint32 {
		if len(v) < 4 {
			return 0
		}
		return nl.NativeEndian().Uint32(v)
	}
	prefix := func(v []byte, bits uint8) netip.Prefix {
		a, ok := netip.AddrFromSlice(v)
		if !ok {
			return netip.Prefix{}
		}
		return netip.PrefixFrom(a, int(bits))
	}
	ports := func(v []byte) *netlink.RulePortRange {
		if len(v) < 4 {
			return nil
		}
		return netlink.NewRulePortRange(nl.NativeEndian().Uint16(v[0:2]), nl.NativeEndian().Uint16(v[2:4]))
	}
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
		case nl.FRA_PRIORITY:
			r.priority = int(u32(v))
		case nl.FRA_TABLE:
			r.table = int(u32(v))
		case nl.FRA_SRC:
			r.src = prefix(v, hdr.Src_len)
		case nl.FRA_DST:
			r.dst = prefix(v, hdr.Dst_len)
		case nl.FRA_IIFNAME:
			r.iif = strings.TrimRight(string(v), "\x00")
		case nl.FRA_OIFNAME:
			r.oif = strings.TrimRight(string(v), "\x00")
		case nl.FRA_FWMARK:
			r.mark = u32(v)
		case nl.FRA_FWMASK:
			mask := u32(v)
			r.mask = &mask
		case nl.FRA_GOTO:
			r.gotoPrio = int(u32(v))
		case nl.FRA_IP_PROTO:
			if len(v) > 0 {
				r.ipproto = v[0]
			}
		case nl.FRA_SPORT_RANGE:
			r.sport = ports(v)
		case nl.FRA_DPORT_RANGE:
			r.dport = ports(v)
		case nl.FRA_UID_RANGE:
			if len(v) >= 8 {
				r.uidRange = netlink.NewRuleUIDRange(nl.NativeEndian().Uint32(v[0:4]), nl.NativeEndian().Uint32(v[4:8]))
			}
		case nl.FRA_L3MDEV:
			r.l3mdev = len(v) > 0 && v[0] != 0
		case nl.FRA_SUPPRESS_PREFIXLEN:
			if p := u32(v); p != 0xffffffff {
				r.suppressPrefixlen = int(p)
			}
		case nl.FRA_SUPPRESS_IFGROUP:
			if g := u32(v); g != 0xffffffff {
				r.suppressIfgroup = int(g)
			}
		}
	}
	// A mark added without a mask is reported with the full mask, which
	// `ip rule` does not print either.
	if r.mask != nil && *r.mask == 0xffffffff {
		r.mask = nil
	}
	return r, nil
}

// ebpfFamily is what the eBPF routing of one family needs.
type ebpfFamily struct {
	af  int
	all netip.Prefix
	// pod is the pod's global address, the source of everything the
	// capture table delivers; IPv6 may have none (link-local only).
	pod   netip.Addr
	probe netip.Addr
	// linkLocal are the interfaces whose link-local destinations are
	// captured too (IPv6).
	linkLocal []netlink.Link
}

// ebpfFamilies are the families the eBPF backend routes in a pod: IPv4
// where the pod has a global IPv4 address; IPv6 where it has any IPv6
// address on an interface but lo, link-local included (it can reach the
// node and its neighbours with those). A family without a pod address
// gets no capture of global destinations: nothing of it can leave with
// the pod's source, and the local route needs that source (without it
// the kernel picks the destination or ::1).
//
// IPv6 needs ::1 on lo to be delivered locally at all (routeFamilies); a
// pod with IPv6 addresses whose lo has none is refused with
// ErrIPv6Uncaptured rather than left with IPv6 around the proxy.
func ebpfFamilies(h *netlink.Handle, addrs podAddrs, cfg PodConfig) ([]ebpfFamily, error) {
	var out []ebpfFamily
	if addrs.v4.IsValid() {
		out = append(out, ebpfFamily{af: unix.AF_INET, all: netip.MustParsePrefix("0.0.0.0/0"), pod: addrs.v4, probe: cfg.ProbeSNAT})
	}
	if addrs.v6.IsValid() || len(addrs.v6Links) > 0 {
		fams, err := routeFamilies(h)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(fams, routeV6) {
			return nil, fmt.Errorf("%w: lo has no ::1, so IPv6 cannot be delivered to the node proxy", ErrIPv6Uncaptured)
		}
		out = append(out, ebpfFamily{af: unix.AF_INET6, all: netip.MustParsePrefix("::/0"), pod: addrs.v6, probe: cfg.ProbeSNATv6, linkLocal: addrs.v6Links})
	}
	return out, nil
}

// wantRules are the rules of family f, in priority order.
func (f ebpfFamily) wantRules(dnsCapture bool) []fibRule {
	mask := uint32(MarkMask)
	base := fibRule{family: f.af, action: frActToTable, suppressPrefixlen: -1, suppressIfgroup: -1}
	probe := base
	probe.priority, probe.dst, probe.table = EbpfRulePriorityProbe, netip.PrefixFrom(f.probe, f.probe.BitLen()), unix.RT_TABLE_MAIN
	proxy := base
	proxy.priority, proxy.mark, proxy.mask, proxy.table = EbpfRulePriorityProxy, ProxyMark, &mask, unix.RT_TABLE_MAIN
	unreachable := base
	unreachable.priority, unreachable.mark, unreachable.mask, unreachable.action = EbpfRulePriorityProxyUnreachable, ProxyMark, &mask, frActUnreachable
	tcpRule := base
	tcpRule.priority, tcpRule.iif, tcpRule.ipproto, tcpRule.table = EbpfRulePriorityTCP, "lo", unix.IPPROTO_TCP, EbpfRouteTable
	rules := []fibRule{probe, proxy, unreachable, tcpRule}
	if dnsCapture {
		dns := base
		dns.priority, dns.iif, dns.ipproto, dns.dport, dns.table = EbpfRulePriorityDNS, "lo", unix.IPPROTO_UDP, netlink.NewRulePortRange(53, 53), EbpfRouteTable
		rules = append(rules, dns)
	}
	return rules
}

// wantRoutes are the routes of family f in EbpfRouteTable, their metrics
// as the kernel reports them.
//
//   - local <all> dev lo src <pod>: every global destination, with the pod's
//     address as source, when the pod has one.
//   - local fe80::/10 dev <interface> metric <ifindex>, per interface with
//     IPv6: a connection to a link-local address is bound to its interface
//     (the address's zone), and the kernel then only takes a route through
//     that interface, never the one through lo. A local route through it
//     still delivers locally. The metrics tell the routes apart: IPv6
//     routes of one prefix and metric replace each other.
func (f ebpfFamily) wantRoutes(lo int) []netlink.Route {
	var out []netlink.Route
	if f.pod.IsValid() {
		r := netlink.Route{
			LinkIndex: lo, Dst: prefixNet(f.all), Src: f.pod.AsSlice(),
			Table: EbpfRouteTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		}
		if f.af == unix.AF_INET6 {
			r.Priority = ip6DefaultMetric
		}
		out = append(out, r)
	}
	for _, l := range f.linkLocal {
		out = append(out, netlink.Route{
			LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("fe80::/10")), Priority: l.Attrs().Index,
			Table: EbpfRouteTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		})
	}
	return out
}

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added
// without one.
const ip6DefaultMetric = 1024

// routeText describes a route of EbpfRouteTable the way `ip route` would.
func routeText(af int, r netlink.Route, linkName func(int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s route table %d:", familyName(af), EbpfRouteTable)
	switch r.Type {
	case unix.RTN_LOCAL:
		b.WriteString(" local")
	case unix.RTN_UNICAST:
	case unix.RTN_UNREACHABLE:
		b.WriteString(" unreachable")
	case unix.RTN_BLACKHOLE:
		b.WriteString(" blackhole")
	case unix.RTN_PROHIBIT:
		b.WriteString(" prohibit")
	case unix.RTN_THROW:
		b.WriteString(" throw")
	default:
		fmt.Fprintf(&b, " type %d", r.Type)
	}
	switch {
	case r.Dst != nil:
		fmt.Fprintf(&b, " %s", r.Dst)
	case af == unix.AF_INET6:
		b.WriteString(" ::/0")
	default:
		b.WriteString(" 0.0.0.0/0")
	}
	if r.Gw != nil {
		fmt.Fprintf(&b, " via %s", r.Gw)
	}
	if r.LinkIndex != 0 {
		fmt.Fprintf(&b, " dev %s", linkName(r.LinkIndex))
	}
	if r.Src != nil {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	if r.Priority != 0 {
		fmt.Fprintf(&b, " metric %d", r.Priority)
	}
	return b.String()
}

// ebpfRoutingState is the eBPF routing a netns has and should have, per
// family, as text.
type ebpfRoutingState struct {
	haveRules, wantRules   map[int][]fibRule
	haveRoutes, wantRoutes map[int][]netlink.Route
	linkName               func(int) string
}

// allFamilies are the families whose routing is listed; a family the pod
// does not route may still hold rules of ours from before (its address
// gone), which are then unexpected.
var allFamilies = []int{unix.AF_INET, unix.AF_INET6}

// readEbpfRouting lists the rules and routes of ours in the netns at path
// and computes those it should have.
func readEbpfRouting(path string, h *netlink.Handle, fams []ebpfFamily, dnsCapture bool) (*ebpfRoutingState, error) {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	names := map[int]string{}
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	s := &ebpfRoutingState{
		haveRules: map[int][]fibRule{}, wantRules: map[int][]fibRule{},
		haveRoutes: map[int][]netlink.Route{}, wantRoutes: map[int][]netlink.Route{},
		linkName: func(i int) string {
			if n, ok := names[i]; ok {
				return n
			}
			return fmt.Sprintf("if%d", i)
		},
	}
	for _, f := range fams {
		s.wantRules[f.af] = f.wantRules(dnsCapture)
		s.wantRoutes[f.af] = f.wantRoutes(lo.Attrs().Index)
	}
	for _, af := range allFamilies {
		rules, err := listEbpfRules(path, af)
		if err != nil {
			return nil, err
		}
		s.haveRules[af] = rules
		routes, err := h.RouteListFiltered(af, &netlink.Route{Table: EbpfRouteTable}, netlink.RT_FILTER_TABLE)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s routes of table %d: %w", familyName(af), EbpfRouteTable, err)
		}
		s.haveRoutes[af] = routes
	}
	return s, nil
}

// diff returns, per family, the rules and routes to remove and to add.
func (s *ebpfRoutingState) diff(af int) (delRules, addRules []fibRule, delRoutes, addRoutes []netlink.Route) {
	delRules, addRules = diffBy(s.haveRules[af], s.wantRules[af], fibRule.String)
	text := func(r netlink.Route) string { return routeText(af, r, s.linkName) }
	delRoutes, addRoutes = diffBy(s.haveRoutes[af], s.wantRoutes[af], text)
	return delRules, addRules, delRoutes, addRoutes
}

// diffBy returns the elements of have that want lacks and those of want
// that have lacks, comparing by key (duplicates count).
func diffBy[T any](have, want []T, key func(T) string) (extra, missing []T) {
	left := map[string]int{}
	for _, w := range want {
		left[key(w)]++
	}
	for _, h := range have {
		if k := key(h); left[k] > 0 {
			left[k]--
		} else {
			extra = append(extra, h)
		}
	}
	seen := map[string]int{}
	for _, h := range have {
		seen[key(h)]++
	}
	for _, w := range want {
		if k := key(w); seen[k] > 0 {
			seen[k]--
		} else {
			missing = append(missing, w)
		}
	}
	return extra, missing
}

// problems describes the differences in words.
func (s *ebpfRoutingState) problems() []string {
	var out []string
	for _, af := range allFamilies {
		delRules, addRules, delRoutes, addRoutes := s.diff(af)
		for _, r := range addRules {
			out = append(out, "missing "+r.String())
		}
		for _, r := range delRules {
			out = append(out, "unexpected "+r.String())
		}
		for _, r := range addRoutes {
			out = append(out, "missing "+routeText(af, r, s.linkName))
		}
		for _, r := range delRoutes {
			out = append(out, "unexpected "+routeText(af, r, s.linkName))
		}
	}
	return out
}

// ensureEbpfRouting makes the eBPF routing of the netns at path what fams
// and dnsCapture want. It adds what is missing first, in priority order,
// and removes what is extra afterwards, in reverse order, so that neither
// a first enrollment, a repair nor a removal opens a moment in which the
// proxy's marked traffic falls into the capture table. The local route is
// replaced in place when only its source changed (the pod's address did).
func ensureEbpfRouting(path string, h *netlink.Handle, fams []ebpfFamily, dnsCapture bool) error {
	s, err := readEbpfRouting(path, h, fams, dnsCapture)
	if err != nil {
		return err
	}
	var errs []error
	for _, af := range allFamilies {
		delRules, addRules, delRoutes, addRoutes := s.diff(af)
		for _, r := range addRoutes {
			if err := h.RouteReplace(&r); err != nil {
				errs = append(errs, fmt.Errorf("add %s: %w", routeText(af, r, s.linkName), err))
			}
		}
		for _, r := range addRules {
			if err := h.RuleAdd(r.netlinkRule()); err != nil && !errors.Is(err, unix.EEXIST) {
				errs = append(errs, fmt.Errorf("add %s: %w", r, err))
			}
		}
		// Highest priority number first: the capture rules go before the
		// rules that keep the proxy's traffic out of them.
		slices.Reverse(delRules)
		for _, r := range delRules {
			if err := h.RuleDel(r.netlinkRule()); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete %s: %w", r, err))
			}
		}
		replaced := func(r netlink.Route) bool {
			// RouteReplace of a wanted route took the place of the one
			// with the same destination, interface and metric (its source
			// was another).
			return slices.ContainsFunc(addRoutes, func(w netlink.Route) bool {
				return r.Type == w.Type && routeDst(af, r) == routeDst(af, w) && r.LinkIndex == w.LinkIndex && r.Priority == w.Priority
			})
		}
		for _, r := range delRoutes {
			if replaced(r) {
				continue
			}
			if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete %s: %w", routeText(af, r, s.linkName), err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("eBPF routing in %s: %w", path, err)
	}
	return nil
}

func routeDst(af int, r netlink.Route) string {
	if r.Dst != nil {
		return r.Dst.String()
	}
	if af == unix.AF_INET6 {
		return "::/0"
	}
	return "0.0.0.0/0"
}

// removeEbpfRouting deletes every rule in the eBPF backend's priority
// range and every route of EbpfRouteTable, in both families.
func removeEbpfRouting(path string, h *netlink.Handle) error {
	return ensureEbpfRouting(path, h, nil, false)
}

// ebpfRoutingProblems lists how the eBPF routing of the netns at path
// differs from what fams and dnsCapture want.
func ebpfRoutingProblems(path string, h *netlink.Handle, fams []ebpfFamily, dnsCapture bool) ([]string, error) {
	s, err := readEbpfRouting(path, h, fams, dnsCapture)
	if err != nil {
		return nil, err
	}
	return s.problems(), nil
}

// hasTable100Rule reports whether the nftables or iptables backend's
// ip rule (fwmark 0x111/0xfff lookup 100) is in either family: a sign of
// their capture.
func hasTable100Rule(h *netlink.Handle) (bool, error) {
	for _, f := range []routeFamily{routeV4, routeV6} {
		ok, err := hasMarkRule(h, f)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			continue
		}
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}
