package redirect

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// A pod that moves to the eBPF backend from the nftables or iptables one
// (the agent's backend reconfigured) still has their capture: nftables
// tables, iptables chains and the table-100 routing. Left in place, a
// connection would be captured twice (a REDIRECT to 127.0.0.1:15001 hides
// the original destination from getsockname()), so the eBPF backend
// removes them, as the nftables and iptables backends remove the other
// mode's rules when a pod changes mode, and Verify reports them.

// netfilterState is the other backends' capture found in a pod.
type netfilterState struct {
	// nftTables are our inet tables (the nftables backend's, either mode).
	nftTables []string
	// table100 is the ip rule of both other backends.
	table100 bool
	// iptChains are our iptables chains that iptables-nft made, as
	// "<family> <table>/<chain>".
	iptChains []string
	// legacy is iptables-legacy's nat, mangle or raw table existing in
	// the namespace; whether it holds our chains takes iptables-save.
	legacy bool
}

// readNetfilter looks for the other backends' capture without running any
// binary: nftables and routing over netlink, iptables-legacy's tables in
// /proc.
func (p *ebpfPod) readNetfilter() (netfilterState, error) {
	var s netfilterState
	conn, err := nftables.New(nftables.WithNetNSFd(int(p.ns.Fd())), nftables.AsLasting())
	if err != nil {
		return s, fmt.Errorf("nftables in %s: %w", p.path, err)
	}
	defer conn.CloseLasting()
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return s, fmt.Errorf("list nftables tables in %s: %w", p.path, err)
	}
	for _, t := range tables {
		if slices.Contains(ourTables, t.Name) {
			s.nftTables = append(s.nftTables, t.Name)
		}
	}
	slices.Sort(s.nftTables)
	for _, fam := range []struct {
		f    nftables.TableFamily
		name string
	}{{nftables.TableFamilyIPv4, "ip"}, {nftables.TableFamilyIPv6, "ip6"}} {
		chains, err := conn.ListChainsOfTableFamily(fam.f)
		if err != nil {
			return s, fmt.Errorf("list nftables chains in %s: %w", p.path, err)
		}
		for _, c := range chains {
			if slices.Contains(ourChains, c.Name) {
				s.iptChains = append(s.iptChains, fmt.Sprintf("%s %s/%s", fam.name, c.Table.Name, c.Name))
			}
		}
	}
	slices.Sort(s.iptChains)
	if s.table100, err = hasTable100Rule(p.h); err != nil {
		return s, err
	}
	if s.legacy, err = legacyTables(p.path); err != nil {
		return s, err
	}
	return s, nil
}

// legacyTables reports whether iptables-legacy has a nat, mangle or raw
// table, where our chains would be, in the netns at path. The kernel
// creates a namespace's legacy tables on first use, so a pod nobody ran
// iptables-legacy in has none. /proc/thread-self is the calling thread's
// namespace; /proc/self would be the main thread's.
func legacyTables(path string) (bool, error) {
	found := false
	err := netns.Do(path, func() error {
		for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
			b, err := os.ReadFile(f)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if slices.Contains(iptTableNames, strings.TrimSpace(sc.Text())) {
					found = true
				}
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("read iptables-legacy tables in %s: %w", path, err)
	}
	return found, nil
}

// legacyChains lists our chains iptables-save finds, for a namespace with
// legacy tables; without the binary there is nothing to look with.
func legacyChains(path string) ([]string, error) {
	var out []string
	b := Iptables{}
	for _, t := range []ipt{b.v4(), b.v6()} {
		if _, err := exec.LookPath(t.save); err != nil {
			continue
		}
		cur, err := t.load(path)
		if err != nil {
			if t.name == "ip6tables" {
				continue // no IPv6 in the namespace: no IPv6 rules either
			}
			return nil, err
		}
		for _, name := range iptTableNames {
			if st := cur[name]; st != nil {
				for _, c := range ourChains {
					if st.chains[c] {
						out = append(out, fmt.Sprintf("%s %s/%s", t.name, name, c))
					}
				}
			}
		}
	}
	return out, nil
}

// netfilterCapture describes the other backends' capture left in the pod.
func (p *ebpfPod) netfilterCapture() ([]string, error) {
	s, err := p.readNetfilter()
	if err != nil {
		return nil, err
	}
	var out []string
	if len(s.nftTables) > 0 {
		out = append(out, fmt.Sprintf("nftables backend's tables present (%s): the pod is captured twice", strings.Join(s.nftTables, ", ")))
	}
	if s.table100 {
		out = append(out, fmt.Sprintf("ip rule fwmark 0x%x/0x%x lookup %d of the nftables or iptables backend present", TProxyMark, MarkMask, RouteTable))
	}
	chains := s.iptChains
	if s.legacy {
		legacy, err := legacyChains(p.path)
		if err != nil {
			return nil, err
		}
		chains = append(chains, legacy...)
	}
	if len(chains) > 0 {
		out = append(out, fmt.Sprintf("iptables backend's chains present (%s): the pod is captured twice", strings.Join(chains, ", ")))
	}
	return out, nil
}

// removeNetfilterCapture removes the other backends' capture from the pod.
// Only what readNetfilter finds is touched, so a pod that never had it
// costs no nftables transaction and runs no binary.
func (p *ebpfPod) removeNetfilterCapture() error {
	s, err := p.readNetfilter()
	if err != nil {
		return err
	}
	var errs []error
	if len(s.nftTables) > 0 {
		conn, err := nftables.New(nftables.WithNetNSFd(int(p.ns.Fd())), nftables.AsLasting())
		if err != nil {
			return fmt.Errorf("nftables in %s: %w", p.path, err)
		}
		defer conn.CloseLasting()
		deleteTables(conn)
		if err := conn.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("delete the nftables backend's tables in %s: %w", p.path, err))
		}
	}
	if s.table100 {
		errs = append(errs, removeRouting(p.h))
	}
	if len(s.iptChains) > 0 || s.legacy {
		b := Iptables{}
		for _, t := range []ipt{b.v4(), b.v6()} {
			if _, err := exec.LookPath(t.save); err != nil {
				if len(s.iptChains) > 0 && t.name == "iptables" {
					errs = append(errs, fmt.Errorf("the iptables backend's chains %v are in %s, and %s is missing to remove them: %w", s.iptChains, p.path, t.save, err))
				}
				continue
			}
			cur, err := t.load(p.path)
			if err != nil {
				if t.name == "iptables" {
					errs = append(errs, err)
				}
				continue
			}
			errs = append(errs, t.remove(p.path, cur))
		}
	}
	return errors.Join(errs...)
}
