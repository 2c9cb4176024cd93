// Package hostrules keeps the node's half of kubelet probe handling
// (docs/wire-contract.md §4.3) in the host network namespace: a set of
// ambient pod IPs and one rule that SNATs the kubelet's TCP connections to
// those IPs to the probe address, which the in-pod rules let through; one
// set and one rule per family. nftables has no --socket-exists, so the rules
// match the kubelet's UID, which the caller configures (Rules.ProbeUID):
// nothing a pod controls, such as a process name, may choose it.
package hostrules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the host table, chain and sets.
const (
	Table = "istio-ambient-nat"
	Chain = "postrouting"
	Set   = "istio-inpod-probes-v4"
	Set6  = "istio-inpod-probes-v6"
)

// Rules are the host rules of one node.
type Rules struct {
	// ProbeUID is the kubelet's user ID (0 on nearly every node). Every
	// TCP connection from the node's network namespace to an enrolled pod
	// made by a socket of this user is SNATed, and so passes the pod's
	// inbound capture: a host-network process of this user is trusted
	// like the kubelet.
	ProbeUID uint32
	// ProbeSNAT and ProbeSNATv6 are the addresses probes of each family
	// are SNATed to.
	ProbeSNAT, ProbeSNATv6 netip.Addr
	// Netns is the host netns path; empty means the caller's.
	Netns string
}

func (r Rules) conn() (*nftables.Conn, func(), error) {
	if r.Netns == "" {
		c, err := nftables.New()
		return c, func() {}, err
	}
	f, err := os.Open(r.Netns)
	if err != nil {
		return nil, nil, fmt.Errorf("open netns: %w", err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return c, func() { f.Close() }, nil
}

func (r Rules) objects() (*nftables.Table, *nftables.Chain, [2]*nftables.Set) {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	accept := nftables.ChainPolicyAccept
	c := &nftables.Chain{Name: Chain, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	sets := [2]*nftables.Set{
		{Table: t, Name: Set, KeyType: nftables.TypeIPAddr},
		{Table: t, Name: Set6, KeyType: nftables.TypeIP6Addr},
	}
	return t, c, sets
}

// family is what the rule and set of IPv4 (0) and IPv6 (1) differ in.
type family struct {
	v6   bool
	set  string
	snat netip.Addr
}

func (r Rules) families() [2]family {
	return [2]family{{set: Set, snat: r.ProbeSNAT}, {v6: true, set: Set6, snat: r.ProbeSNATv6}}
}

// ruleText is the rule as nft prints it, stored as user data so Verify
// can recognise it.
func (r Rules) ruleText(f family) string {
	ip := "ip"
	if f.v6 {
		ip = "ip6"
	}
	return fmt.Sprintf("meta l4proto tcp meta skuid %d %s daddr @%s snat %s to %s", r.ProbeUID, ip, f.set, ip, f.snat)
}

func (r Rules) rule(t *nftables.Table, c *nftables.Chain, s *nftables.Set, f family) *nftables.Rule {
	uid := binary.NativeEndian.AppendUint32(nil, r.ProbeUID)
	proto, offset, size := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if f.v6 {
		proto, offset, size = unix.NFPROTO_IPV6, 24, 16
	}
	return &nftables.Rule{Table: t, Chain: c, UserData: []byte(r.ruleText(f)), Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: uid},
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
		&expr.Immediate{Register: 1, Data: f.snat.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(proto), RegAddrMin: 1},
	}}
}

// setElements are the ips of one family.
func setElements(ips []netip.Addr, f family) []nftables.SetElement {
	var out []nftables.SetElement
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.Is6() == f.v6 {
			out = append(out, nftables.SetElement{Key: ip.AsSlice()})
		}
	}
	return out
}

func (r Rules) validate() error {
	if !r.ProbeSNAT.Is4() {
		return fmt.Errorf("probe SNAT address %v is not IPv4", r.ProbeSNAT)
	}
	if !r.ProbeSNATv6.Is6() || r.ProbeSNATv6.Is4In6() || r.ProbeSNATv6.Zone() != "" {
		return fmt.Errorf("probe SNAT address %v is not IPv6", r.ProbeSNATv6)
	}
	return nil
}

// Sync replaces the host table with the rules and exactly ips, in one
// transaction.
func (r Rules) Sync(ips []netip.Addr) error {
	if err := r.validate(); err != nil {
		return err
	}
	conn, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	t, c, sets := r.objects()
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	conn.AddChain(c)
	for i, f := range r.families() {
		if err := conn.AddSet(sets[i], setElements(ips, f)); err != nil {
			return fmt.Errorf("host probe set %s: %w", f.set, err)
		}
		conn.AddRule(r.rule(t, c, sets[i], f))
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install host probe rules: %w", err)
	}
	return nil
}

// Add puts pod IPs in the sets.
func (r Rules) Add(ips ...netip.Addr) error { return r.elements(ips, true) }

// Remove takes pod IPs out of the sets; absent ones are fine.
func (r Rules) Remove(ips ...netip.Addr) error { return r.elements(ips, false) }

func (r Rules) elements(ips []netip.Addr, add bool) error {
	if len(ips) == 0 {
		return nil
	}
	conn, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	_, _, sets := r.objects()
	var errs []error
	for i, f := range r.families() {
		els := setElements(ips, f)
		if len(els) == 0 {
			continue
		}
		if add {
			errs = append(errs, addElements(conn, sets[i], els))
		} else {
			errs = append(errs, deleteElements(conn, sets[i], els))
		}
	}
	return errors.Join(errs...)
}

func addElements(conn *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	if err := conn.SetAddElements(s, els); err != nil {
		return err
	}
	return conn.Flush()
}

// deleteElements deletes one by one: deleting an absent element fails the
// batch.
func deleteElements(conn *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	var err error
	for _, e := range els {
		_ = conn.SetDeleteElements(s, []nftables.SetElement{e})
		if ferr := conn.Flush(); ferr != nil && !errors.Is(ferr, unix.ENOENT) {
			err = errors.Join(err, ferr)
		}
	}
	return err
}

// Verify reports how the host table differs from the rules and ips.
func (r Rules) Verify(ips []netip.Addr) ([]string, error) {
	conn, done, err := r.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	t, c, _ := r.objects()
	var problems []string
	rules, err := conn.GetRules(t, c)
	if err != nil {
		return []string{"missing table or chain " + Table + "/" + Chain}, nil
	}
	var got, want []string
	for _, rule := range rules {
		got = append(got, string(rule.UserData))
	}
	for _, f := range r.families() {
		want = append(want, r.ruleText(f))
	}
	if !slices.Equal(got, want) {
		problems = append(problems, fmt.Sprintf("chain %s/%s holds %q, want %q", Table, Chain, got, want))
	}
	for _, f := range r.families() {
		p, err := verifySet(conn, t, f, ips)
		if err != nil {
			return nil, err
		}
		problems = append(problems, p...)
	}
	return problems, nil
}

func verifySet(conn *nftables.Conn, t *nftables.Table, f family, ips []netip.Addr) ([]string, error) {
	have, ok, err := members(conn, t, f)
	if err != nil {
		return nil, err
	}
	if !ok {
		return []string{"missing set " + f.set}, nil
	}
	var want []netip.Addr
	for _, e := range setElements(ips, f) {
		a, _ := netip.AddrFromSlice(e.Key)
		want = append(want, a)
	}
	slices.SortFunc(have, netip.Addr.Compare)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(have, want) {
		return []string{fmt.Sprintf("set %s holds %v, want %v", f.set, have, want)}, nil
	}
	return nil, nil
}

// members lists the addresses in f's set; ok is false when the set is
// missing.
func members(conn *nftables.Conn, t *nftables.Table, f family) (ips []netip.Addr, ok bool, err error) {
	set, err := conn.GetSetByName(t, f.set)
	if err != nil {
		return nil, false, nil
	}
	els, err := conn.GetSetElements(set)
	if err != nil {
		return nil, true, fmt.Errorf("list %s: %w", f.set, err)
	}
	for _, e := range els {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			ips = append(ips, a)
		}
	}
	return ips, true, nil
}

// Members lists the addresses in the probe sets, both families; a missing
// table or set holds none.
func (r Rules) Members() ([]netip.Addr, error) {
	conn, done, err := r.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	t, _, _ := r.objects()
	var all []netip.Addr
	for _, f := range r.families() {
		ips, _, err := members(conn, t, f)
		if err != nil {
			return nil, err
		}
		all = append(all, ips...)
	}
	return all, nil
}

// Delete removes the host table (uninstall).
func (r Rules) Delete() error {
	conn, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	t, _, _ := r.objects()
	conn.AddTable(t)
	conn.DelTable(t)
	return conn.Flush()
}
