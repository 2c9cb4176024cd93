package redirect

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/google/nftables"
)

// Nftables programs the rules over netlink in dedicated inet tables, all
// in one transaction (no nft binary involved).
type Nftables struct{}

// Name implements Backend.
func (Nftables) Name() string { return "nftables" }

// ourTables are the tables of both modes: a pod holds one mode's, and
// enrolling it in the other replaces them.
var ourTables = []string{MangleTable, NatTable, RawTable, SidecarMangleTable, SidecarNatTable, SidecarRawTable}

var chainHooks = map[string]*nftables.ChainHook{
	"prerouting": nftables.ChainHookPrerouting, "output": nftables.ChainHookOutput, "postrouting": nftables.ChainHookPostrouting,
}

// nftConn opens the netns at path and one netlink connection into it.
func nftConn(path string) (*os.File, *nftables.Conn, error) {
	f, err := openNetns(path)
	if err != nil {
		return nil, nil, err
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("nftables in %s: %w", path, err)
	}
	return f, conn, nil
}

// Enroll implements Backend: it replaces the three tables in one batch,
// then ensures the ip rule and route.
func (n Nftables) Enroll(netnsPath string, cfg PodConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	f, conn, err := nftConn(netnsPath)
	if err != nil {
		return err
	}
	defer f.Close()
	defer conn.CloseLasting()
	// Replacing existing tables costs the kernel a grace period per base
	// chain (hook unregistration); a first enrollment skips it.
	existing, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list nftables tables in %s: %w", netnsPath, err)
	}
	if slices.ContainsFunc(existing, func(t *nftables.Table) bool { return slices.Contains(ourTables, t.Name) }) {
		deleteTables(conn)
	}
	for _, t := range nftRules(cfg) {
		addTable(conn, t)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install nftables rules in %s: %w", netnsPath, err)
	}
	h, err := routingHandle(f)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := routingFor(cfg)(h); err != nil {
		return err
	}
	return migrateFor(netnsPath, cfg)
}

// deleteTables queues the deletion of our tables. Adding first makes the
// delete succeed when a table is absent; the batch is atomic either way.
func deleteTables(conn *nftables.Conn) {
	for _, name := range ourTables {
		t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
		conn.AddTable(t)
		conn.DelTable(t)
	}
}

func addTable(conn *nftables.Conn, t nftTable) {
	table := conn.AddTable(&nftables.Table{Name: t.Name, Family: nftables.TableFamilyINet})
	chains := map[string]*nftables.Chain{}
	// Chains first: a jump must find its target in the same batch.
	for _, c := range t.Chains {
		ch := &nftables.Chain{Name: c.Name, Table: table}
		if c.Hook != nil {
			accept := nftables.ChainPolicyAccept
			ch.Type, ch.Hooknum, ch.Priority, ch.Policy = nftables.ChainType(c.Hook.Type), chainHooks[c.Hook.Hook], nftables.ChainPriorityRef(nftables.ChainPriority(c.Hook.Priority)), &accept
		}
		chains[c.Name] = conn.AddChain(ch)
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			// The rule's text rides along as user data: Verify reads it
			// back, and `nft list` shows it as a comment-like annotation.
			conn.AddRule(&nftables.Rule{Table: table, Chain: chains[c.Name], Exprs: r.exprs(), UserData: []byte(r.String())})
		}
	}
}

// Unenroll implements Backend.
func (n Nftables) Unenroll(netnsPath string) error {
	f, conn, err := nftConn(netnsPath)
	if err != nil {
		return err
	}
	defer f.Close()
	defer conn.CloseLasting()
	deleteTables(conn)
	var errs []error
	if err := conn.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete nftables rules in %s: %w", netnsPath, err))
	}
	h, err := routingHandle(f)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer h.Close()
	return errors.Join(append(errs, removeRouting(h))...)
}

// Verify implements Backend: every table, chain (with its hook) and rule
// (in order, by its text) must be as Enroll makes it, and nothing more.
func (n Nftables) Verify(netnsPath string, cfg PodConfig) error {
	f, conn, err := nftConn(netnsPath)
	if err != nil {
		return err
	}
	defer f.Close()
	defer conn.CloseLasting()
	problems, err := nftDrift(conn, nftRules(cfg))
	if err != nil {
		return err
	}
	if cfg.Sidecar == nil {
		h, err := routingHandle(f)
		if err != nil {
			return err
		}
		defer h.Close()
		missing, err := verifyRouting(h)
		if err != nil {
			return err
		}
		problems = append(problems, missing...)
		off, err := verifyMigrate(netnsPath)
		if err != nil {
			return err
		}
		problems = append(problems, off...)
	}
	if len(problems) > 0 {
		return &DriftError{Problems: problems}
	}
	return nil
}

func nftDrift(conn *nftables.Conn, want []nftTable) ([]string, error) {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	have := map[string]*nftables.Chain{}
	for _, c := range chains {
		if slices.Contains(ourTables, c.Table.Name) {
			have[c.Table.Name+"/"+c.Name] = c
		}
	}
	var problems []string
	for _, t := range want {
		for _, c := range t.Chains {
			key := t.Name + "/" + c.Name
			ch := have[key]
			delete(have, key)
			if ch == nil {
				problems = append(problems, "missing chain "+key)
				continue
			}
			if c.Hook != nil && (ch.Hooknum == nil || *ch.Hooknum != *chainHooks[c.Hook.Hook] || ch.Priority == nil ||
				int(*ch.Priority) != c.Hook.Priority || string(ch.Type) != c.Hook.Type) {
				problems = append(problems, fmt.Sprintf("chain %s is not type %s hook %s priority %d", key, c.Hook.Type, c.Hook.Hook, c.Hook.Priority))
			}
			rules, err := conn.GetRules(ch.Table, ch)
			if err != nil {
				return nil, fmt.Errorf("list rules of %s: %w", key, err)
			}
			var got []string
			for _, r := range rules {
				got = append(got, string(r.UserData))
			}
			var wantRules []string
			for _, r := range c.Rules {
				wantRules = append(wantRules, r.String())
			}
			if !slices.Equal(got, wantRules) {
				problems = append(problems, fmt.Sprintf("chain %s has rules %q, want %q", key, got, wantRules))
			}
		}
	}
	for key := range have {
		problems = append(problems, "unexpected chain "+key)
	}
	slices.Sort(problems)
	return problems, nil
}
