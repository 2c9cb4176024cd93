package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Limits of a parsed resolv.conf. The nameserver count and the option caps
// are glibc's (MAXNS, RES_MAXNDOTS, RES_MAXRETRANS, RES_MAXRETRY), so a pod's
// file means here what it means to the pod's own resolver.
const (
	// MaxResolvConfSize bounds the file: a real resolv.conf is a few
	// hundred bytes, and the file may come from a pod.
	MaxResolvConfSize = 64 << 10
	// MaxNameservers is how many nameserver lines count; later ones are
	// ignored.
	MaxNameservers = 3
	// MaxSearch bounds the search list at Kubernetes' limit for a pod's
	// dnsConfig; glibc since 2.26 has none.
	MaxSearch = 32
	// MaxNdots, MaxTimeout and MaxAttempts are where larger option
	// values are clamped.
	MaxNdots    = 15
	MaxTimeout  = 30 * time.Second
	MaxAttempts = 5
)

// glibc's defaults for options a file does not set.
const (
	defaultNdots    = 1
	defaultTimeout  = 5 * time.Second
	defaultAttempts = 2
)

var (
	// ErrNoNameserver is a resolv.conf without any usable nameserver line.
	// glibc would then query 127.0.0.1, which inside a pod is rarely a
	// resolver, so the caller decides instead.
	ErrNoNameserver = errors.New("no usable nameserver")
	// ErrTooLarge is a resolv.conf over MaxResolvConfSize.
	ErrTooLarge = errors.New("resolv.conf too large")
)

// Config is what a resolv.conf says about name resolution.
type Config struct {
	// Nameservers holds 1 to MaxNameservers addresses in file order. An
	// IPv6 address may carry a zone ("fe80::1%eth0").
	Nameservers []netip.Addr
	// Search is the search list, at most MaxSearch names, lower-cased
	// and without a trailing dot: the last "search" or "domain" line.
	Search []string
	// Ndots is 0 to MaxNdots; 1 when unset.
	Ndots int
	// Timeout is a whole number of seconds from 1s to MaxTimeout; 5s
	// when unset.
	Timeout time.Duration
	// Attempts is 1 to MaxAttempts; 2 when unset.
	Attempts int
}

// Upstreams returns the nameservers with the DNS port, 53.
func (c Config) Upstreams() []netip.AddrPort {
	out := make([]netip.AddrPort, len(c.Nameservers))
	for i, a := range c.Nameservers {
		out[i] = netip.AddrPortFrom(a, 53)
	}
	return out
}

// Parse reads a resolv.conf the way glibc does: a keyword counts only at the
// start of a line and followed by a space or a tab, lines starting with '#'
// or ';' and unknown lines are ignored, a line ends at a NUL, text after a
// nameserver's address is ignored, and an address that does not parse does
// not take one of the MaxNameservers places. Two differences: a '\r' is
// whitespace (glibc would reject the address before it), and IPv4 is read
// only in dotted-quad form (glibc also takes inet_aton's "127.1" and hex).
// Search names that are not host names are dropped. Options other than
// ndots, timeout and attempts are ignored; an option value that does not
// start with a digit leaves the option unset.
func Parse(b []byte) (Config, error) {
	if len(b) > MaxResolvConfSize {
		return Config{}, fmt.Errorf("parse resolv.conf of %d bytes: %w", len(b), ErrTooLarge)
	}
	c := Config{Ndots: defaultNdots, Timeout: defaultTimeout, Attempts: defaultAttempts}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if i := bytes.IndexByte(line, 0); i >= 0 {
			line = line[:i]
		}
		s := string(line)
		switch {
		case keyword(s, "nameserver"):
			if len(c.Nameservers) == MaxNameservers {
				continue
			}
			f := fields(s[len("nameserver"):])
			if len(f) == 0 {
				continue
			}
			if a, err := netip.ParseAddr(f[0]); err == nil {
				c.Nameservers = append(c.Nameservers, a)
			}
		case keyword(s, "domain"):
			// glibc takes the first word as the domain and makes it
			// the whole search list; an empty line changes nothing.
			if f := fields(s[len("domain"):]); len(f) > 0 {
				c.Search = searchList(f[:1])
			}
		case keyword(s, "search"):
			if f := fields(s[len("search"):]); len(f) > 0 {
				c.Search = searchList(f)
			}
		case keyword(s, "options"):
			for _, o := range fields(s[len("options"):]) {
				c.option(o)
			}
		}
	}
	if len(c.Nameservers) == 0 {
		return Config{}, fmt.Errorf("parse resolv.conf: %w", ErrNoNameserver)
	}
	return c, nil
}

// keyword reports whether line starts with kw followed by a space or tab.
func keyword(line, kw string) bool {
	return len(line) > len(kw) && strings.HasPrefix(line, kw) && (line[len(kw)] == ' ' || line[len(kw)] == '\t')
}

func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' })
}

// searchList keeps the host names among names, normalised, up to MaxSearch.
func searchList(names []string) []string {
	var out []string
	for _, n := range names {
		if len(out) == MaxSearch {
			break
		}
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if isHostName(n) {
			out = append(out, n)
		}
	}
	return out
}

// isHostName reports whether s is a non-empty name of at most 253 bytes
// whose labels are 1 to 63 letters, digits, '-' or '_'.
func isHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			ch := l[i]
			if !('a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '_') {
				return false
			}
		}
	}
	return true
}

// option applies one "name:value" token of an options line.
func (c *Config) option(o string) {
	name, val, ok := strings.Cut(o, ":")
	if !ok {
		return
	}
	n, ok := leadingInt(val)
	if !ok {
		return
	}
	switch name {
	case "ndots":
		c.Ndots = min(n, MaxNdots)
	case "timeout":
		// glibc waits at least a second whatever the value.
		c.Timeout = time.Duration(max(1, min(n, int(MaxTimeout/time.Second)))) * time.Second
	case "attempts":
		// glibc would make no attempt at all for 0.
		c.Attempts = max(1, min(n, MaxAttempts))
	}
}

// leadingInt reads the decimal digits at the start of s as atoi does,
// saturating rather than overflowing.
func leadingInt(s string) (int, bool) {
	n, i := 0, 0
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		if n < 1<<20 {
			n = n*10 + int(s[i]-'0')
		}
	}
	return n, i > 0
}
