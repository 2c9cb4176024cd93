// Package hostrules keeps the node's half of kubelet probe handling
// (docs/wire-contract.md §4.3) in the host network namespace: a set of
// ambient pod IPs and one rule that SNATs the kubelet's TCP connections to
// those IPs to the probe address, which the in-pod rules let through.
// nftables has no --socket-exists, so the rule matches the kubelet's UID.
package hostrules

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the host table, chain and set.
const (
	Table = "istio-ambient-nat"
	Chain = "postrouting"
	Set   = "istio-inpod-probes-v4"
)

// Rules are the host rules of one node.
type Rules struct {
	// ProbeUID is the kubelet's user ID.
	ProbeUID uint32
	// ProbeSNAT is the address probes are SNATed to.
	ProbeSNAT netip.Addr
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

func (r Rules) objects() (*nftables.Table, *nftables.Chain, *nftables.Set) {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	accept := nftables.ChainPolicyAccept
	c := &nftables.Chain{Name: Chain, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	s := &nftables.Set{Table: t, Name: Set, KeyType: nftables.TypeIPAddr}
	return t, c, s
}

// ruleText is the rule as nft prints it, stored as user data so Verify
// can recognise it.
func (r Rules) ruleText() string {
	return fmt.Sprintf("meta l4proto tcp meta skuid %d ip daddr @%s snat ip to %s", r.ProbeUID, Set, r.ProbeSNAT)
}

func (r Rules) rule(t *nftables.Table, c *nftables.Chain, s *nftables.Set) *nftables.Rule {
	uid := binary.NativeEndian.AppendUint32(nil, r.ProbeUID)
	snat := r.ProbeSNAT.As4()
	return &nftables.Rule{Table: t, Chain: c, UserData: []byte(r.ruleText()), Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: uid},
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
		&expr.Immediate{Register: 1, Data: snat[:]},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}}
}

func elements(ips []netip.Addr) []nftables.SetElement {
	var out []nftables.SetElement
	for _, ip := range ips {
		if ip.Is4() {
			b := ip.As4()
			out = append(out, nftables.SetElement{Key: b[:]})
		}
	}
	return out
}

// Sync replaces the host table with the rule and exactly ips, in one
// transaction.
func (r Rules) Sync(ips []netip.Addr) error {
	if !r.ProbeSNAT.Is4() {
		return fmt.Errorf("probe SNAT address %v is not IPv4", r.ProbeSNAT)
	}
	conn, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	t, c, s := r.objects()
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	conn.AddChain(c)
	if err := conn.AddSet(s, elements(ips)); err != nil {
		return fmt.Errorf("host probe set: %w", err)
	}
	conn.AddRule(r.rule(t, c, s))
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install host probe rules: %w", err)
	}
	return nil
}

// Add puts pod IPs in the set.
func (r Rules) Add(ips ...netip.Addr) error { return r.elements(ips, true) }

// Remove takes pod IPs out of the set; absent ones are fine.
func (r Rules) Remove(ips ...netip.Addr) error { return r.elements(ips, false) }

func (r Rules) elements(ips []netip.Addr, add bool) error {
	els := elements(ips)
	if len(els) == 0 {
		return nil
	}
	conn, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	_, _, s := r.objects()
	if add {
		err = conn.SetAddElements(s, els)
	} else {
		// Deleting an absent element fails the batch: delete one by one.
		for _, e := range els {
			_ = conn.SetDeleteElements(s, []nftables.SetElement{e})
			if ferr := conn.Flush(); ferr != nil && !errors.Is(ferr, unix.ENOENT) {
				err = errors.Join(err, ferr)
			}
		}
		return err
	}
	if err != nil {
		return err
	}
	return conn.Flush()
}

// Verify reports how the host table differs from the rule and ips.
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
	if len(rules) != 1 || string(rules[0].UserData) != r.ruleText() {
		problems = append(problems, fmt.Sprintf("chain %s/%s does not hold exactly %q", Table, Chain, r.ruleText()))
	}
	set, err := conn.GetSetByName(t, Set)
	if err != nil {
		return append(problems, "missing set "+Set), nil
	}
	els, err := conn.GetSetElements(set)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Set, err)
	}
	var have, want []string
	for _, e := range els {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			have = append(have, a.String())
		}
	}
	for _, ip := range ips {
		if ip.Is4() {
			want = append(want, ip.String())
		}
	}
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		problems = append(problems, fmt.Sprintf("set %s holds %v, want %v", Set, have, want))
	}
	return problems, nil
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

// FindKubeletUID returns the user ID of the process named kubelet under
// procRoot (normally /proc).
func FindKubeletUID(procRoot string) (uint32, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "kubelet" {
			continue
		}
		f, err := os.Open(filepath.Join(procRoot, e.Name(), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
				fields := strings.Fields(rest)
				if len(fields) > 0 {
					uid, err := strconv.ParseUint(fields[0], 10, 32)
					f.Close()
					return uint32(uid), err
				}
			}
		}
		f.Close()
	}
	return 0, errors.New("no kubelet process found")
}
