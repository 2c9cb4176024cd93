package redirect

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The sidecar capture is written once, as sRules in neither backend's
// syntax, and rendered for each: iptables text (iptables-save's canonical
// form, so Verify compares text with text) and nftables terms. Both
// backends thus install the same rules in the same order.

// iptables chains of the sidecar capture: the names the sidecar's own
// init container gives them, so that tools and people who know those
// find them. nftables uses the same names in lower case with '-'.
const (
	chainInbound    = "ISTIO_INBOUND"
	chainRedirect   = "ISTIO_REDIRECT"
	chainInRedirect = "ISTIO_IN_REDIRECT"
	chainOutputDNS  = "ISTIO_OUTPUT_DNS"
	chainDrop       = "ISTIO_DROP"
	// The output chain is outChain, ISTIO_OUTPUT, as in ambient mode.
)

// ourChains are every iptables chain either mode creates: whatever of
// them a netns holds is Canopy's to replace or remove.
var ourChains = []string{preChain, outChain, chainInbound, chainRedirect, chainInRedirect, chainOutputDNS, chainDrop}

// nftName is an iptables chain's name in the nftables tables.
func nftName(chain string) string { return strings.ToLower(strings.ReplaceAll(chain, "_", "-")) }

// Addresses of the sidecar rules, per family.
var (
	loopback4 = netip.MustParsePrefix("127.0.0.1/32")
	loopback6 = netip.MustParsePrefix("::1/128")
	// The proxy's inbound passthrough connects to the app from this
	// source, over lo; it must reach the app, not the proxy again.
	passthrough4 = netip.MustParsePrefix("127.0.0.6/32")
	passthrough6 = netip.MustParsePrefix("::6/128")
)

// proxyPorts are never captured inbound: the proxy's own ports.
var proxyPorts = []uint16{SidecarStatusPort, SidecarReadinessPort, SidecarEnvoyPromPort}

type actionKind int

const (
	actReturn actionKind = iota
	actJump
	actRedirect
	actZone
	actDrop
)

// action is what a matching packet gets.
type action struct {
	kind  actionKind
	chain string // actJump
	n     uint16 // actRedirect: the port; actZone: the zone
}

var actRet = action{kind: actReturn}

func jumpTo(chain string) action  { return action{kind: actJump, chain: chain} }
func redirectTo(p uint16) action  { return action{kind: actRedirect, n: p} }
func zoneSet(zone uint16) action  { return action{kind: actZone, n: zone} }
func ownerIs(id uint32) *owner    { return &owner{ID: id} }
func ownerIsNot(id uint32) *owner { return &owner{Not: true, ID: id} }

// owner matches the UID or GID owning the packet's socket.
type owner struct {
	Not bool
	ID  uint32
}

// sRule is one rule of the sidecar capture. The zero value of a field
// matches everything. A rule with an address match belongs to the family
// of the address.
type sRule struct {
	Src     netip.Prefix
	Dst     netip.Prefix
	NotDst  bool
	In, Out string
	Proto   l4proto
	// DPorts, with Proto: the destination port is one of them (or, with
	// NotDPorts, none of them).
	DPorts    []uint16
	NotDPorts bool
	SPort     uint16
	Invalid   bool // conntrack state INVALID
	UID, GID  *owner
	Do        action
}

// is6 reports whether the rule is IPv6's only, is4 IPv4's only.
func (r sRule) is6() bool {
	return (r.Src.IsValid() && r.Src.Addr().Is6()) || (r.Dst.IsValid() && r.Dst.Addr().Is6())
}

func (r sRule) is4() bool {
	return (r.Src.IsValid() && r.Src.Addr().Is4()) || (r.Dst.IsValid() && r.Dst.Addr().Is4())
}

// ipt renders the rule's matches and target as iptables-save prints them.
func (r sRule) ipt() string {
	var p []string
	if r.Src.IsValid() {
		p = append(p, "-s", r.Src.Masked().String())
	}
	if r.Dst.IsValid() {
		if r.NotDst {
			p = append(p, "!")
		}
		p = append(p, "-d", r.Dst.Masked().String())
	}
	if r.In != "" {
		p = append(p, "-i", r.In)
	}
	if r.Out != "" {
		p = append(p, "-o", r.Out)
	}
	proto := ""
	if r.Proto != 0 {
		proto = strings.TrimPrefix(r.Proto.String(), "meta l4proto ")
		p = append(p, "-p", proto)
	}
	not := func(b bool) []string {
		if b {
			return []string{"!"}
		}
		return nil
	}
	switch {
	case len(r.DPorts) == 1:
		p = append(p, "-m", proto)
		p = append(p, not(r.NotDPorts)...)
		p = append(p, "--dport", strconv.Itoa(int(r.DPorts[0])))
	case len(r.DPorts) > 1:
		ports := make([]string, len(r.DPorts))
		for i, d := range r.DPorts {
			ports[i] = strconv.Itoa(int(d))
		}
		p = append(p, "-m", "multiport")
		p = append(p, not(r.NotDPorts)...)
		p = append(p, "--dports", strings.Join(ports, ","))
	}
	if r.SPort != 0 {
		p = append(p, "-m", proto, "--sport", strconv.Itoa(int(r.SPort)))
	}
	if r.Invalid {
		p = append(p, "-m", "conntrack", "--ctstate", "INVALID")
	}
	for _, o := range []struct {
		o    *owner
		flag string
	}{{r.UID, "--uid-owner"}, {r.GID, "--gid-owner"}} {
		if o.o != nil {
			p = append(p, "-m", "owner")
			p = append(p, not(o.o.Not)...)
			p = append(p, o.flag, strconv.FormatUint(uint64(o.o.ID), 10))
		}
	}
	switch r.Do.kind {
	case actReturn:
		p = append(p, "-j", "RETURN")
	case actJump:
		p = append(p, "-j", r.Do.chain)
	case actRedirect:
		p = append(p, "-j", "REDIRECT", "--to-ports", strconv.Itoa(int(r.Do.n)))
	case actZone:
		p = append(p, "-j", "CT", "--zone", strconv.Itoa(int(r.Do.n)))
	case actDrop:
		p = append(p, "-j", "DROP")
	}
	return strings.Join(p, " ")
}

// nft renders the rule as nftables terms.
func (r sRule) nft() nftRule {
	var out nftRule
	if r.In != "" {
		out = append(out, ifname{Name: r.In})
	}
	if r.Out != "" {
		out = append(out, ifname{Out: true, Name: r.Out})
	}
	if r.Proto != 0 {
		out = append(out, r.Proto)
	}
	if r.Src.IsValid() {
		out = append(out, ipaddr{Src: true, Prefix: r.Src.Masked()})
	}
	if r.Dst.IsValid() {
		out = append(out, ipaddr{Not: r.NotDst, Prefix: r.Dst.Masked()})
	}
	// "none of a, b" is "not a and not b"; "one of a" is a itself (the
	// rules never ask for one of several).
	for _, d := range r.DPorts {
		out = append(out, port{Proto: uint8(r.Proto), Not: r.NotDPorts, Port: d})
	}
	if r.SPort != 0 {
		out = append(out, port{Proto: uint8(r.Proto), Src: true, Port: r.SPort})
	}
	if r.Invalid {
		out = append(out, ctInvalid{})
	}
	if r.UID != nil {
		out = append(out, skid{Not: r.UID.Not, ID: r.UID.ID})
	}
	if r.GID != nil {
		out = append(out, skid{GID: true, Not: r.GID.Not, ID: r.GID.ID})
	}
	switch r.Do.kind {
	case actReturn:
		out = append(out, ret)
	case actJump:
		out = append(out, jump(nftName(r.Do.chain)))
	case actRedirect:
		out = append(out, redirect(r.Do.n))
	case actZone:
		out = append(out, ctZone(r.Do.n))
	case actDrop:
		out = append(out, verdict{Kind: expr.VerdictDrop})
	}
	return out
}

// sChain is a chain of ours and its rules.
type sChain struct {
	Name  string
	Rules []sRule
}

// sTable is one table of the sidecar capture: the rules in the built-in
// PREROUTING and OUTPUT chains (jumps to ours, nothing else), and our
// chains.
type sTable struct {
	Name     string // nat, mangle or raw
	Pre, Out []sRule
	Chains   []sChain
}

// sidecarTables is the sidecar capture of c, in the order the sidecar's
// init container installs it (REDIRECT mode), with two differences that
// change nothing a packet meets: interface rules sit at the top of our
// chains instead of in the built-in ones (so removing ours removes them),
// and the jump to ISTIO_INBOUND is always there.
func sidecarTables(c *SidecarConfig) []sTable {
	tcp, udp := l4proto(unix.IPPROTO_TCP), l4proto(unix.IPPROTO_UDP)
	twin := func(rule func(loopback, passthrough netip.Prefix) sRule) []sRule {
		return []sRule{rule(loopback4, passthrough4), rule(loopback6, passthrough6)}
	}

	// Inbound: a VM's interfaces first, as its outbound traffic; then
	// excluded interfaces, the tunnel port, and the ports.
	var inbound []sRule
	for _, k := range c.RerouteInterfaces {
		if c.IncludeOutbound.All {
			inbound = append(inbound, sRule{In: k, Do: jumpTo(chainRedirect)})
		}
		for _, p := range byFamily(c.IncludeOutbound.Prefixes) {
			inbound = append(inbound, sRule{In: k, Dst: p, Do: jumpTo(chainRedirect)})
		}
	}
	for _, k := range c.RerouteInterfaces {
		inbound = append(inbound, sRule{In: k, Do: actRet})
	}
	for _, x := range c.ExcludeInterfaces {
		inbound = append(inbound, sRule{In: x, Do: actRet})
	}
	inbound = append(inbound, sRule{Proto: tcp, DPorts: []uint16{HBONEPort}, Do: actRet})
	excluded := dedupPorts(slices.Concat(c.ExcludeInboundPorts, proxyPorts))
	if c.IncludeInbound.All {
		for _, p := range excluded {
			inbound = append(inbound, sRule{Proto: tcp, DPorts: []uint16{p}, Do: actRet})
		}
		inbound = append(inbound, sRule{Proto: tcp, Do: jumpTo(chainInRedirect)})
	} else {
		// An excluded port stays excluded even when listed: the proxy's
		// own ports must never loop back into it.
		for _, p := range dedupPorts(c.IncludeInbound.Ports) {
			if p != HBONEPort && !slices.Contains(excluded, p) {
				inbound = append(inbound, sRule{Proto: tcp, DPorts: []uint16{p}, Do: jumpTo(chainInRedirect)})
			}
		}
	}

	// Outbound.
	var out []sRule
	for _, x := range c.ExcludeInterfaces {
		out = append(out, sRule{Out: x, Do: actRet})
	}
	for _, p := range dedupPorts(c.ExcludeOutboundPorts) {
		out = append(out,
			sRule{Proto: tcp, DPorts: []uint16{p}, Do: actRet},
			sRule{Proto: udp, DPorts: []uint16{p}, Do: actRet})
	}
	out = append(out, twin(func(_, pass netip.Prefix) sRule { return sRule{Out: "lo", Src: pass, Do: actRet} })...)
	// With a loopback range included, the app's own lo traffic is
	// captured like any other.
	loopbackIncluded := slices.ContainsFunc(c.IncludeOutbound.Prefixes, func(p netip.Prefix) bool { return p.Addr().IsLoopback() })
	for _, id := range []struct {
		uid bool
		id  uint32
	}{{uid: true, id: c.ProxyUID}, {uid: false, id: c.ProxyGID}} {
		own := func(o *owner) sRule {
			if id.uid {
				return sRule{UID: o}
			}
			return sRule{GID: o}
		}
		// The proxy calling the pod's own address over lo (the app called
		// a service VIP that resolved to itself) goes to the inbound
		// listener: app -> proxy outbound -> proxy inbound -> app.
		notPorts := []uint16{HBONEPort}
		if c.DNSCapture && id.uid {
			notPorts = []uint16{53, HBONEPort}
		}
		out = append(out, twin(func(lo, _ netip.Prefix) sRule {
			r := own(ownerIs(id.id))
			r.Out, r.Dst, r.NotDst, r.Proto, r.DPorts, r.NotDPorts = "lo", lo, true, tcp, notPorts, true
			r.Do = jumpTo(chainInRedirect)
			return r
		})...)
		// The app calling itself over lo stays on lo; with DNS capture,
		// but for TCP DNS, which goes to the proxy's DNS server even on lo.
		if !loopbackIncluded {
			r := own(ownerIsNot(id.id))
			r.Out, r.Do = "lo", actRet
			if c.DNSCapture {
				r.Proto, r.DPorts, r.NotDPorts = tcp, []uint16{53}, true
			}
			out = append(out, r)
		}
		// The proxy's own traffic is never captured again.
		r := own(ownerIs(id.id))
		r.Do = actRet
		out = append(out, r)
	}
	if c.DNSCapture {
		out = append(out, sRule{Do: jumpTo(chainOutputDNS)})
	}
	out = append(out, twin(func(lo, _ netip.Prefix) sRule { return sRule{Dst: lo, Do: actRet} })...)
	for _, p := range byFamily(c.ExcludeOutbound) {
		out = append(out, sRule{Dst: p, Do: actRet})
	}
	for _, p := range dedupPorts(c.IncludeOutboundPorts) {
		out = append(out, sRule{Proto: tcp, DPorts: []uint16{p}, Do: jumpTo(chainRedirect)})
	}
	if c.IncludeOutbound.All {
		out = append(out, sRule{Do: jumpTo(chainRedirect)})
	}
	for _, p := range byFamily(c.IncludeOutbound.Prefixes) {
		out = append(out, sRule{Dst: p, Do: jumpTo(chainRedirect)})
	}

	nat := sTable{
		Name: "nat",
		Pre:  []sRule{{Proto: tcp, Do: jumpTo(chainInbound)}},
		Out:  []sRule{{Do: jumpTo(outChain)}},
		Chains: []sChain{
			{Name: chainInbound, Rules: inbound},
			{Name: chainRedirect, Rules: []sRule{{Proto: tcp, Do: redirectTo(OutboundPort)}}},
			{Name: chainInRedirect, Rules: []sRule{{Proto: tcp, Do: redirectTo(InboundPort)}}},
			{Name: outChain, Rules: out},
		},
	}
	var tables []sTable
	if c.DropInvalid {
		tables = append(tables, sTable{
			Name:   "mangle",
			Pre:    []sRule{{Invalid: true, Do: jumpTo(chainDrop)}},
			Chains: []sChain{{Name: chainDrop, Rules: []sRule{{Do: action{kind: actDrop}}}}},
		})
	}
	if c.DNSCapture {
		nat.Chains = append(nat.Chains, sChain{Name: chainOutputDNS, Rules: []sRule{
			{Proto: tcp, DPorts: []uint16{53}, Do: redirectTo(DNSPort)},
			{Proto: udp, DPorts: []uint16{53}, Do: redirectTo(DNSPort)},
		}})
	}
	tables = append(tables, nat)
	if c.DNSCapture {
		// The proxy's queries upstream and their answers in one conntrack
		// zone, the app's queries to the proxy and the answers in another,
		// so the two legs of a redirected query never share an entry.
		var zones []sRule
		for _, o := range []sRule{{UID: ownerIs(c.ProxyUID)}, {GID: ownerIs(c.ProxyGID)}} {
			up, answer := o, o
			up.Proto, up.DPorts, up.Do = udp, []uint16{53}, zoneSet(1)
			answer.Proto, answer.SPort, answer.Do = udp, DNSPort, zoneSet(2)
			zones = append(zones, up, answer)
		}
		zones = append(zones, sRule{Proto: udp, DPorts: []uint16{53}, Do: zoneSet(2)})
		tables = append(tables, sTable{
			Name: "raw",
			Pre:  []sRule{{Do: jumpTo(chainInbound)}},
			Out:  []sRule{{Do: jumpTo(chainOutputDNS)}},
			Chains: []sChain{
				{Name: chainInbound, Rules: []sRule{{Proto: udp, SPort: 53, Do: zoneSet(1)}}},
				{Name: chainOutputDNS, Rules: zones},
			},
		})
	}
	return tables
}

// byFamily orders prefixes IPv4 first, each family's in its own order.
func byFamily(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortStableFunc(out, func(a, b netip.Prefix) int {
		switch {
		case a.Addr().Is4() == b.Addr().Is4():
			return 0
		case a.Addr().Is4():
			return -1
		}
		return 1
	})
	return out
}

// dedupPorts drops repeated ports, keeping the first.
func dedupPorts(ps []uint16) []uint16 {
	var out []uint16
	for _, p := range ps {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// iptSidecarRules renders the sidecar tables for one family: v6 for
// ip6tables.
func iptSidecarRules(c *SidecarConfig, v6 bool) []iptTable {
	keep := func(r sRule) bool { return !(v6 && r.is4()) && !(!v6 && r.is6()) }
	var out []iptTable
	for _, t := range sidecarTables(c) {
		it := iptTable{Name: t.Name}
		for _, h := range []struct {
			chain string
			rules []sRule
		}{{"PREROUTING", t.Pre}, {"OUTPUT", t.Out}} {
			for _, r := range h.rules {
				it.Jumps = append(it.Jumps, "-A "+h.chain+" "+r.ipt())
			}
		}
		for _, c := range t.Chains {
			it.Chains = append(it.Chains, c.Name)
			for _, r := range c.Rules {
				if keep(r) {
					it.Rules = append(it.Rules, "-A "+c.Name+" "+r.ipt())
				}
			}
		}
		out = append(out, it)
	}
	return out
}

// nftSidecarRules renders the sidecar tables as nftables tables, one inet
// table each, with a base chain per hook.
func nftSidecarRules(c *SidecarConfig) []nftTable {
	names := map[string]string{"nat": SidecarNatTable, "mangle": SidecarMangleTable, "raw": SidecarRawTable}
	hooks := map[string]struct {
		typ      string
		priority int
	}{"nat": {"nat", -100}, "mangle": {"filter", -150}, "raw": {"filter", -300}}
	var out []nftTable
	for _, t := range sidecarTables(c) {
		nt := nftTable{Name: names[t.Name]}
		h := hooks[t.Name]
		for _, b := range []struct {
			hook  string
			rules []sRule
		}{{"prerouting", t.Pre}, {"output", t.Out}} {
			if len(b.rules) == 0 {
				continue
			}
			ch := nftChain{Name: b.hook, Hook: &nftHook{Type: h.typ, Hook: b.hook, Priority: h.priority}}
			for _, r := range b.rules {
				ch.Rules = append(ch.Rules, r.nft())
			}
			nt.Chains = append(nt.Chains, ch)
		}
		for _, c := range t.Chains {
			ch := nftChain{Name: nftName(c.Name)}
			for _, r := range c.Rules {
				ch.Rules = append(ch.Rules, r.nft())
			}
			nt.Chains = append(nt.Chains, ch)
		}
		out = append(out, nt)
	}
	return out
}

// skid: meta skuid|skgid [!=] id, the owner of the packet's socket.
type skid struct {
	GID bool
	Not bool
	ID  uint32
}

func (s skid) exprs() []expr.Any {
	key := expr.MetaKeySKUID
	if s.GID {
		key = expr.MetaKeySKGID
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: cmpOp(s.Not), Register: 1, Data: u32(s.ID)},
	}
}

func (s skid) String() string {
	key := "skuid"
	if s.GID {
		key = "skgid"
	}
	return fmt.Sprintf("meta %s %s%d", key, neq(s.Not), s.ID)
}

// ctInvalid: ct state invalid.
type ctInvalid struct{}

func (ctInvalid) exprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(expr.CtStateBitINVALID), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
	}
}

func (ctInvalid) String() string { return "ct state invalid" }
