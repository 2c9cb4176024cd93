package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// Iptables loads the rules of wire contract §4.2 with iptables-restore
// --noflush, for nodes whose other tooling expects iptables. Restore and Save
// name the binaries (default iptables-restore and iptables-save, whichever
// variant the node's alternatives select).
type Iptables struct {
	Restore, Save string
}

// Name implements Backend.
func (Iptables) Name() string { return "iptables" }

func (b Iptables) bin(name, def string) string {
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

func (b Iptables) save(netnsPath string) (saved, error) {
	out, err := runIn(netnsPath, "", b.bin(b.Save, "iptables-save"))
	if err != nil {
		return nil, err
	}
	return parseSave(out), nil
}

// Enroll implements Backend.
func (b Iptables) Enroll(netnsPath string, cfg PodConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cur, err := b.save(netnsPath)
	if err != nil {
		return err
	}
	want := iptRules(cfg)
	// Tables this configuration does not use lose our chains.
	cleanup := b.removal(cur, func(table string) bool {
		return !slices.ContainsFunc(want, func(t iptTable) bool { return t.Name == table })
	})
	input := cleanup + restoreInput(want, cur.has)
	if _, err := runIn(netnsPath, input, b.bin(b.Restore, "iptables-restore"), "--noflush"); err != nil {
		return fmt.Errorf("install iptables rules in %s: %w", netnsPath, err)
	}
	return withRouting(netnsPath, ensureRouting)
}

// removal renders the deletion of our jumps and chains in the tables
// selected.
func (b Iptables) removal(cur saved, selected func(table string) bool) string {
	var sb strings.Builder
	for _, name := range []string{"mangle", "nat", "raw"} {
		t := cur[name]
		if t == nil || !selected(name) || (!t.chains[preChain] && !t.chains[outChain]) {
			continue
		}
		fmt.Fprintf(&sb, "*%s\n", name)
		for _, r := range t.rules {
			if r == "-A PREROUTING -j "+preChain || r == "-A OUTPUT -j "+outChain {
				sb.WriteString("-D" + r[2:] + "\n")
			}
		}
		for _, c := range []string{preChain, outChain} {
			if t.chains[c] {
				fmt.Fprintf(&sb, "-F %s\n-X %s\n", c, c)
			}
		}
		sb.WriteString("COMMIT\n")
	}
	return sb.String()
}

// Unenroll implements Backend.
func (b Iptables) Unenroll(netnsPath string) error {
	cur, err := b.save(netnsPath)
	if err != nil {
		return err
	}
	var errs []error
	if input := b.removal(cur, func(string) bool { return true }); input != "" {
		if _, err := runIn(netnsPath, input, b.bin(b.Restore, "iptables-restore"), "--noflush"); err != nil {
			errs = append(errs, fmt.Errorf("delete iptables rules in %s: %w", netnsPath, err))
		}
	}
	return errors.Join(append(errs, withRouting(netnsPath, removeRouting))...)
}

// Verify implements Backend.
func (b Iptables) Verify(netnsPath string, cfg PodConfig) error {
	cur, err := b.save(netnsPath)
	if err != nil {
		return err
	}
	var problems []string
	want := iptRules(cfg)
	for _, t := range want {
		for _, j := range t.Jumps {
			if !cur.has(t.Name, j) {
				problems = append(problems, fmt.Sprintf("%s: missing %q", t.Name, j))
			}
		}
		// Rules are ordered within a chain; iptables-save orders chains
		// its own way.
		var got []string
		if st := cur[t.Name]; st != nil {
			got = st.rules
		}
		for _, chain := range []string{preChain, outChain} {
			if g, w := ofChain(got, chain), ofChain(t.Rules, chain); !slices.Equal(g, w) {
				problems = append(problems, fmt.Sprintf("%s: %s rules %q, want %q", t.Name, chain, g, w))
			}
		}
	}
	for name, st := range cur {
		used := slices.ContainsFunc(want, func(t iptTable) bool { return t.Name == name })
		if !used && (st.chains[preChain] || st.chains[outChain]) {
			problems = append(problems, fmt.Sprintf("%s: unexpected chains", name))
		}
	}
	missing, err := routingState(netnsPath)
	if err != nil {
		return err
	}
	if problems = append(problems, missing...); len(problems) > 0 {
		slices.Sort(problems)
		return &DriftError{Problems: problems}
	}
	return nil
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
