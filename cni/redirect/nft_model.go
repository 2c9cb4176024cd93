package redirect

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables rules are built from small terms, each of which knows its
// netlink expressions and its nft text; the text is what golden files and
// error messages show.

// term is one match or action of a rule.
type term interface {
	exprs() []expr.Any
	String() string
}

// nftTable is one inet table.
type nftTable struct {
	Name   string
	Chains []nftChain
}

// nftChain is a chain; Hook is nil for a regular chain.
type nftChain struct {
	Name  string
	Hook  *nftHook
	Rules []nftRule
}

type nftHook struct {
	Type     string // nat, filter, route
	Hook     string // prerouting, output, postrouting
	Priority int
}

type nftRule []term

func (r nftRule) String() string {
	parts := make([]string, len(r))
	for i, t := range r {
		parts[i] = t.String()
	}
	return strings.Join(parts, " ")
}

func (r nftRule) exprs() []expr.Any {
	var out []expr.Any
	for _, t := range r {
		out = append(out, t.exprs()...)
	}
	return out
}

// render prints tables the way `nft list` does, roughly; golden files
// hold it.
func render(tables []nftTable) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "table inet %s {\n", t.Name)
		for _, c := range t.Chains {
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			if c.Hook != nil {
				fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", c.Hook.Type, c.Hook.Hook, c.Hook.Priority)
			}
			for _, r := range c.Rules {
				fmt.Fprintf(&b, "\t\t%s\n", r)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func cmpOp(not bool) expr.CmpOp {
	if not {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

func neq(not bool) string {
	if not {
		return "!= "
	}
	return ""
}

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// l4proto: meta l4proto tcp|udp.
type l4proto uint8

func (p l4proto) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(p)}},
	}
}

func (p l4proto) String() string {
	if p == unix.IPPROTO_TCP {
		return "meta l4proto tcp"
	}
	return "meta l4proto udp"
}

// ipaddr: ip|ip6 saddr|daddr [!=] prefix, the family taken from the
// prefix. In an inet table a network header match needs the family check
// first; the check also keeps each rule to its own family.
type ipaddr struct {
	Src    bool
	Not    bool
	Prefix netip.Prefix
}

func (a ipaddr) exprs() []expr.Any {
	proto, size, offset := byte(unix.NFPROTO_IPV4), uint32(4), uint32(16)
	if a.Src {
		offset = 12
	}
	if a.Prefix.Addr().Is6() {
		proto, size, offset = unix.NFPROTO_IPV6, 16, 24
		if a.Src {
			offset = 8
		}
	}
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
	}
	if a.Prefix.Bits() < int(size)*8 {
		mask := make([]byte, size)
		for i := 0; i < a.Prefix.Bits(); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)})
	}
	addr := a.Prefix.Masked().Addr().AsSlice()
	return append(out, &expr.Cmp{Op: cmpOp(a.Not), Register: 1, Data: addr})
}

func (a ipaddr) String() string {
	fam, dir := "ip", "daddr"
	if a.Prefix.Addr().Is6() {
		fam = "ip6"
	}
	if a.Src {
		dir = "saddr"
	}
	p := a.Prefix.String()
	if a.Prefix.IsSingleIP() {
		p = a.Prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s %s%s", fam, dir, neq(a.Not), p)
}

// port: tcp|udp dport|sport [!=] n. Follows an l4proto term.
type port struct {
	Proto uint8
	Src   bool
	Not   bool
	Port  uint16
}

func (p port) exprs() []expr.Any {
	offset := uint32(2)
	if p.Src {
		offset = 0
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
		&expr.Cmp{Op: cmpOp(p.Not), Register: 1, Data: u16(p.Port)},
	}
}

func (p port) String() string {
	proto, dir := "udp", "dport"
	if p.Proto == unix.IPPROTO_TCP {
		proto = "tcp"
	}
	if p.Src {
		dir = "sport"
	}
	return fmt.Sprintf("%s %s %s%d", proto, dir, neq(p.Not), p.Port)
}

// mark: meta mark & mask [!=] value, or ct mark with Ct.
type mark struct {
	Ct    bool
	Not   bool
	Mask  uint32
	Value uint32
}

func (m mark) exprs() []expr.Any {
	var load expr.Any = &expr.Meta{Key: expr.MetaKeyMARK, Register: 1}
	if m.Ct {
		load = &expr.Ct{Key: expr.CtKeyMARK, Register: 1}
	}
	return []expr.Any{
		load,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(m.Mask), Xor: u32(0)},
		&expr.Cmp{Op: cmpOp(m.Not), Register: 1, Data: u32(m.Value)},
	}
}

func (m mark) String() string {
	what := "meta mark"
	if m.Ct {
		what = "ct mark"
	}
	op := "=="
	if m.Not {
		op = "!="
	}
	return fmt.Sprintf("%s & 0x%x %s 0x%x", what, m.Mask, op, m.Value)
}

// ifname: meta iifname|oifname [!=] name.
type ifname struct {
	Out  bool
	Not  bool
	Name string
}

func (i ifname) exprs() []expr.Any {
	key := expr.MetaKeyIIFNAME
	if i.Out {
		key = expr.MetaKeyOIFNAME
	}
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, i.Name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: cmpOp(i.Not), Register: 1, Data: name},
	}
}

func (i ifname) String() string {
	key := "iifname"
	if i.Out {
		key = "oifname"
	}
	return fmt.Sprintf("%s %s%q", key, neq(i.Not), i.Name)
}

// verdict: accept, return, or jump to a chain.
type verdict struct {
	Kind  expr.VerdictKind
	Chain string
}

func (v verdict) exprs() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: v.Kind, Chain: v.Chain}}
}

func (v verdict) String() string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictDrop:
		return "drop"
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

var (
	accept = verdict{Kind: expr.VerdictAccept}
	ret    = verdict{Kind: expr.VerdictReturn}
)

func jump(chain string) verdict { return verdict{Kind: expr.VerdictJump, Chain: chain} }

// redirect: redirect to :port.
type redirect uint16

func (r redirect) exprs() []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: u16(uint16(r))},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func (r redirect) String() string { return fmt.Sprintf("redirect to :%d", uint16(r)) }

// connmarkFromMark: ct mark set ct mark & ^mask | value (wire contract §4.4).
type connmarkFromMark struct{ Mask, Value uint32 }

func (c connmarkFromMark) exprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^c.Mask), Xor: u32(c.Value)},
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
	}
}

func (c connmarkFromMark) String() string {
	return fmt.Sprintf("ct mark set ct mark & 0x%x | 0x%x", ^c.Mask, c.Value)
}

// markFromConnmark: meta mark set ct mark.
type markFromConnmark struct{}

func (markFromConnmark) exprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
	}
}

func (markFromConnmark) String() string { return "meta mark set ct mark" }

// ctZone: ct zone set n.
type ctZone uint16

func (z ctZone) exprs() []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, uint16(z))},
		&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true},
	}
}

func (z ctZone) String() string { return fmt.Sprintf("ct zone set %d", uint16(z)) }
