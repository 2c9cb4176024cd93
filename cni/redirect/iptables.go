package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// Iptables loads the rules of wire contract §4.2 with iptables-restore
// --noflush, and their IPv6 twins with ip6tables-restore, for nodes whose
// other tooling expects iptables. Restore, Save, Restore6 and Save6 name the
// binaries (default iptables-restore, iptables-save, ip6tables-restore and
// ip6tables-save, whichever variant the node's alternatives select).
//
// IPv6 is captured wherever ip6tables-save runs in the pod's netns; an
// ip6tables-restore that then fails is an error, as for IPv4. Where
// ip6tables-save does not run (no binary, no kernel support), a pod
// without IPv6 addresses is enrolled with IPv4 rules alone, and a pod with
// any IPv6 address but ::1 (link-local included: it reaches the node and,
// on a bridge, other pods) is refused with ErrIPv6Uncaptured rather than
// left with IPv6 around the proxy; Verify reports such a pod as drift.
type Iptables struct {
	Restore, Save   string
	Restore6, Save6 string
}

// ErrIPv6Uncaptured is a pod with IPv6 addresses in a netns where the
// backend cannot install IPv6 rules.
var ErrIPv6Uncaptured = errors.New("pod has IPv6 addresses but no IPv6 rules can be installed")

// Name implements Backend.
func (Iptables) Name() string { return "iptables" }

// ipt is the pair of binaries of one family.
type ipt struct {
	name, restore, save string
	// label prefixes drift reports: "" for IPv4, as before IPv6 was
	// captured, "ip6tables " for IPv6.
	label string
}

func (b Iptables) v4() ipt {
	return ipt{name: "iptables", restore: or(b.Restore, "iptables-restore"), save: or(b.Save, "iptables-save")}
}

func (b Iptables) v6() ipt {
	return ipt{name: "ip6tables", restore: or(b.Restore6, "ip6tables-restore"), save: or(b.Save6, "ip6tables-save"), label: "ip6tables "}
}

func or(name, def string) string {
	if name == "" {
		return def
	}
	return name
}

// run runs a command inside a netns; processes started in netns.Do are
// born there.
func runIn(netnsPath, stdin string, name string, args ...string) ([]byte, error) {
	var out []byte
	err := netns.Do(netnsPath, func() error {
		cmd := exec.Command(name, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	return out, err
}

// saved is iptables-save output: per table, its chains and its rules.
type saved map[string]*savedTable

type savedTable struct {
	chains map[string]bool
	rules  []string
}

func parseSave(out []byte) saved {
	s := saved{}
	var cur *savedTable
	for line := range strings.SplitSeq(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &savedTable{chains: map[string]bool{}}
			s[line[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			cur.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			cur.rules = append(cur.rules, line)
		}
	}
	return s
}

func (s saved) has(table, rule string) bool {
	t := s[table]
	return t != nil && slices.Contains(t.rules, rule)
}

func (t ipt) load(netnsPath string) (saved, error) {
	out, err := runIn(netnsPath, "", t.save)
	if err != nil {
		return nil, err
	}
	return parseSave(out), nil
}

// Probe reports what the backend needs and the node (or the agent's
// image) lacks: the IPv4 iptables-restore and iptables-save. Without them
// every pod's enrollment would fail, so an agent checks at start and
// names what is missing. The IPv6 pair is optional: without it, pods with
// IPv6 addresses are refused (ErrIPv6Uncaptured).
func (b Iptables) Probe() error {
	v4 := b.v4()
	for _, bin := range []string{v4.restore, v4.save} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("the iptables backend runs %s: %w", bin, err)
		}
	}
	return nil
}

// Enroll implements Backend. IPv6 goes first, so a pod refused for its
// IPv6 gets no rules at all.
func (b Iptables) Enroll(netnsPath string, cfg PodConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cur6, err := b.v6().load(netnsPath)
	if err != nil {
		if err := refuseIPv6(netnsPath, err); err != nil {
			return err
		}
	} else if err := b.v6().apply(netnsPath, cur6, iptRules(cfg, familyV6(cfg))); err != nil {
		return err
	}
	cur, err := b.v4().load(netnsPath)
	if err != nil {
		return err
	}
	if err := b.v4().apply(netnsPath, cur, iptRules(cfg, familyV4(cfg))); err != nil {
		return err
	}
	if err := withRouting(netnsPath, routingFor(cfg)); err != nil {
		return err
	}
	return migrateFor(netnsPath, cfg)
}

// routingFor is what Enroll does to the routing of table 100: ambient
// pods need it; sidecar pods do not, and lose it if they had it.
func routingFor(cfg PodConfig) func(*netlink.Handle) error {
	if cfg.Sidecar != nil {
		return removeRouting
	}
	return ensureRouting
}

// refuseIPv6 decides for a netns where ip6tables failed (unavailable): a
// pod with IPv6 addresses is refused, one without is fine.
func refuseIPv6(netnsPath string, unavailable error) error {
	addrs, err := ipv6Addresses(netnsPath)
	if err != nil {
		return err
	}
	if len(addrs) > 0 {
		return fmt.Errorf("%w: %v in %s: %w", ErrIPv6Uncaptured, addrs, netnsPath, unavailable)
	}
	return nil
}

// iptTableNames are the tables either mode uses, in the order they are
// written.
var iptTableNames = []string{"mangle", "nat", "raw"}

func findTable(tables []iptTable, name string) *iptTable {
	for i := range tables {
		if tables[i].Name == name {
			return &tables[i]
		}
	}
	return nil
}

// isOurJump reports whether rule, as iptables-save prints it, is in a
// built-in chain and jumps to one of ours.
func isOurJump(rule string) bool {
	if !strings.HasPrefix(rule, "-A PREROUTING ") && !strings.HasPrefix(rule, "-A OUTPUT ") {
		return false
	}
	return slices.ContainsFunc(ourChains, func(c string) bool { return strings.HasSuffix(rule, " -j "+c) })
}

// stale renders the removal of what of ours table t holds and want (nil:
// nothing of the table) does not: the jumps, then the chains, all flushed
// before any is deleted since ours jump to each other. A pod that changes
// mode (ambient, sidecar) loses the old mode's chains this way.
func stale(t *savedTable, want *iptTable) []string {
	if t == nil {
		return nil
	}
	var lines, gone []string
	for _, r := range t.rules {
		if isOurJump(r) && (want == nil || !slices.Contains(want.Jumps, r)) {
			lines = append(lines, "-D"+r[2:])
		}
	}
	for _, c := range ourChains {
		if t.chains[c] && (want == nil || !slices.Contains(want.Chains, c)) {
			gone = append(gone, c)
		}
	}
	for _, c := range gone {
		lines = append(lines, "-F "+c)
	}
	for _, c := range gone {
		lines = append(lines, "-X "+c)
	}
	return lines
}

// apply replaces our chains of one family with want, in one
// iptables-restore.
func (t ipt) apply(netnsPath string, cur saved, want []iptTable) error {
	var b strings.Builder
	cleanup := map[string][]string{}
	for _, name := range iptTableNames {
		w := findTable(want, name)
		lines := stale(cur[name], w)
		switch {
		case w != nil:
			cleanup[name] = lines
		case len(lines) > 0:
			// A table this configuration does not use loses our chains.
			fmt.Fprintf(&b, "*%s\n%s\nCOMMIT\n", name, strings.Join(lines, "\n"))
		}
	}
	input := b.String() + restoreInput(want, cur.has, cleanup)
	if _, err := runIn(netnsPath, input, t.restore, "--noflush"); err != nil {
		return fmt.Errorf("install %s rules in %s: %w", t.name, netnsPath, err)
	}
	return nil
}

// removal renders the deletion of our jumps and chains in every table.
func removal(cur saved) string {
	var sb strings.Builder
	for _, name := range iptTableNames {
		if lines := stale(cur[name], nil); len(lines) > 0 {
			fmt.Fprintf(&sb, "*%s\n%s\nCOMMIT\n", name, strings.Join(lines, "\n"))
		}
	}
	return sb.String()
}

// Unenroll implements Backend.
func (b Iptables) Unenroll(netnsPath string) error {
	var errs []error
	if cur, err := b.v4().load(netnsPath); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, b.v4().remove(netnsPath, cur))
	}
	// A netns where ip6tables does not run holds no IPv6 rules of ours:
	// Enroll could not have made any.
	if cur, err := b.v6().load(netnsPath); err == nil {
		errs = append(errs, b.v6().remove(netnsPath, cur))
	}
	return errors.Join(append(errs, withRouting(netnsPath, removeRouting))...)
}

// remove deletes our jumps and chains of one family.
func (t ipt) remove(netnsPath string, cur saved) error {
	input := removal(cur)
	if input == "" {
		return nil
	}
	if _, err := runIn(netnsPath, input, t.restore, "--noflush"); err != nil {
		return fmt.Errorf("delete %s rules in %s: %w", t.name, netnsPath, err)
	}
	return nil
}

// Verify implements Backend.
func (b Iptables) Verify(netnsPath string, cfg PodConfig) error {
	cur, err := b.v4().load(netnsPath)
	if err != nil {
		return err
	}
	problems := b.v4().drift(cur, iptRules(cfg, familyV4(cfg)))
	if cur6, err := b.v6().load(netnsPath); err != nil {
		if err := refuseIPv6(netnsPath, err); err != nil {
			if !errors.Is(err, ErrIPv6Uncaptured) {
				return err
			}
			problems = append(problems, err.Error())
		}
	} else {
		problems = append(problems, b.v6().drift(cur6, iptRules(cfg, familyV6(cfg)))...)
	}
	if cfg.Sidecar == nil {
		missing, err := routingState(netnsPath)
		if err != nil {
			return err
		}
		off, err := verifyMigrate(netnsPath)
		if err != nil {
			return err
		}
		problems = append(problems, append(missing, off...)...)
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return &DriftError{Problems: problems}
	}
	return nil
}

// drift lists how one family's tables differ from want.
func (t ipt) drift(cur saved, want []iptTable) []string {
	var problems []string
	for _, w := range want {
		st := cur[w.Name]
		for _, j := range w.Jumps {
			if !cur.has(w.Name, j) {
				problems = append(problems, fmt.Sprintf("%s%s: missing %q", t.label, w.Name, j))
			}
		}
		// Rules are ordered within a chain; iptables-save orders chains
		// its own way.
		var got []string
		if st != nil {
			got = st.rules
		}
		for _, chain := range w.Chains {
			if st == nil || !st.chains[chain] {
				problems = append(problems, fmt.Sprintf("%s%s: missing chain %s", t.label, w.Name, chain))
			}
			if g, r := ofChain(got, chain), ofChain(w.Rules, chain); !slices.Equal(g, r) {
				problems = append(problems, fmt.Sprintf("%s%s: %s rules %q, want %q", t.label, w.Name, chain, g, r))
			}
		}
		if left := stale(st, &w); len(left) > 0 {
			problems = append(problems, fmt.Sprintf("%s%s: unexpected %q", t.label, w.Name, left))
		}
	}
	for name, st := range cur {
		if findTable(want, name) == nil && len(stale(st, nil)) > 0 {
			problems = append(problems, fmt.Sprintf("%s%s: unexpected chains", t.label, name))
		}
	}
	return problems
}

func ofChain(rules []string, chain string) []string {
	var out []string
	for _, r := range rules {
		if strings.HasPrefix(r, "-A "+chain+" ") {
			out = append(out, r)
		}
	}
	return out
}
