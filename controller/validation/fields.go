package validation

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
)

const (
	// MaxRegexLength is the longest regular expression Istio accepts: it
	// approximates Envoy's limit on a compiled RE2 program by the
	// expression's length.
	MaxRegexLength = 1024
	// MaxRegexProgramSize is the largest compiled program Envoy runs in
	// Istio's sidecars (re2.max_program_size.error_level in the bootstrap
	// pilot-agent writes; Envoy's own default is 100). Go's regexp is RE2's
	// syntax and builds a program the same way, so its instruction count
	// stands in for RE2's program size.
	MaxRegexProgramSize = 32768
)

// Regex checks a regular expression that Envoy (RE2) and grpc-go (Go's
// regexp) will compile: not empty, at most MaxRegexLength bytes, valid RE2
// syntax, and a program of at most MaxRegexProgramSize instructions. where
// names the field in the message, as Istio's do.
func Regex(re, where string) error {
	if re == "" {
		return fmt.Errorf("%q: regex string match should not be empty", where)
	}
	if len(re) > MaxRegexLength {
		return fmt.Errorf("%q: regex is too large, max length allowed is %d", where, MaxRegexLength)
	}
	if _, err := regexp.Compile(re); err != nil {
		return fmt.Errorf("%q: %w; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)", where, err)
	}
	if n := programSize(re); n > MaxRegexProgramSize {
		return fmt.Errorf("%q: regex program size %d is larger than %d, the largest Envoy runs", where, n, MaxRegexProgramSize)
	}
	return nil
}

// programSize is the number of instructions of re's compiled program
// (re compiles).
func programSize(re string) int {
	parsed, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		return math.MaxInt
	}
	return len(prog.Inst)
}

// stringMatch checks a match of headers, methods and the like: a prefix
// may not be empty (Envoy's StringMatcher refuses it) and a regex must
// compile.
func stringMatch(sm *networkingapi.StringMatch, where string) error {
	switch sm.GetMatchType().(type) {
	case *networkingapi.StringMatch_Prefix:
		if sm.GetPrefix() == "" {
			return fmt.Errorf("%q: prefix string match should not be empty", where)
		}
	case *networkingapi.StringMatch_Regex:
		return Regex(sm.GetRegex(), where)
	}
	return nil
}

// stringMatchRegex checks only a regex match: a URI's empty prefix matches
// everything and Envoy takes it.
func stringMatchRegex(sm *networkingapi.StringMatch, where string) error {
	if _, ok := sm.GetMatchType().(*networkingapi.StringMatch_Regex); ok {
		return Regex(sm.GetRegex(), where)
	}
	return nil
}

// tchar is the set of characters of an HTTP token (RFC 9110 §5.6.2),
// which a header name is.
const tchars = "!#$%&'*+-.^_`|~ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(tchars, s[i]) < 0 {
			return false
		}
	}
	return true
}

// pseudoHeaders are the HTTP/2 pseudo-headers a route may match on.
var pseudoHeaders = []string{":method", ":scheme", ":authority", ":path", ":status"}

// jwtClaimHeader is the prefix of the header names that route on a JWT
// claim (gateways only).
const jwtClaimHeader = "@request.auth.claims"

// isJWTClaimRoute reports a header name of the form
// "@request.auth.claims.a.b" or "@request.auth.claims[a][b]".
func isJWTClaimRoute(name string) bool {
	if len(name) < len(jwtClaimHeader) || !strings.EqualFold(name[:len(jwtClaimHeader)], jwtClaimHeader) {
		return false
	}
	rest := name[len(jwtClaimHeader):]
	return (strings.HasPrefix(rest, ".") && len(rest) > 1) ||
		(strings.HasPrefix(rest, "[") && strings.HasSuffix(rest, "]") && len(rest) > 2)
}

// HeaderName checks the name of a header a route matches on: an HTTP
// token, one of the pseudo-headers Envoy matches, or a JWT claim (which
// VirtualService refuses outside gateways).
func HeaderName(name string) error {
	switch {
	case name == "":
		return errors.New("header name cannot be empty")
	case isJWTClaimRoute(name), slices.Contains(pseudoHeaders, name):
		return nil
	case !isToken(name):
		return fmt.Errorf("header name %s is not a valid header name", name)
	}
	return nil
}

// isInternalHeader: Envoy refuses to modify pseudo-headers and Host.
func isInternalHeader(name string) bool {
	return strings.HasPrefix(name, ":") || strings.EqualFold(name, "host")
}

func isAuthorityHeader(name string) bool {
	return strings.EqualFold(name, ":authority") || strings.EqualFold(name, "host")
}

// headerSetName checks a request header to add or set: anything but a
// pseudo-header other than :authority.
func headerSetName(name string) error {
	if name == "" {
		return errors.New("header name cannot be empty")
	}
	if isInternalHeader(name) && !isAuthorityHeader(name) {
		return fmt.Errorf(`invalid header %q: header cannot have ":" prefix`, name)
	}
	return nil
}

// headerOperationName checks a header to remove, or a response header to
// add or set.
func headerOperationName(name string) error {
	if name == "" {
		return errors.New("header name cannot be empty")
	}
	if strings.EqualFold(name, "host") {
		return fmt.Errorf(`invalid header %q: cannot set Host header`, name)
	}
	if isInternalHeader(name) {
		return fmt.Errorf(`invalid header %q: header cannot have ":" prefix`, name)
	}
	return nil
}

// headerValue refuses control characters other than tab, which Envoy's
// HeaderValueOption refuses (protoc-gen-validate's HTTP_HEADER_VALUE).
func headerValue(value string) error {
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Errorf("header value configuration %s is invalid", value)
		}
	}
	return nil
}

// headerField refuses what Envoy refuses in a header value it is given as
// a string (a rewritten path or authority, a redirect's): NUL, CR and LF.
func headerField(value, where string) error {
	if strings.ContainsAny(value, "\x00\r\n") {
		return fmt.Errorf("%s %q may not contain NUL, CR or LF", where, value)
	}
	return nil
}

// dns1123Label: lower and upper case letters, digits and '-', not at
// either end, at most 63 characters (Istio's labels.IsDNS1123Label).
func dns1123Label(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

// wildcardLabel is a first label Istio takes: "*", or a DNS label after
// "*" or "*-" ("*foo", "*-foo"). A '*' anywhere else is refused.
func wildcardLabel(s string) bool {
	if len(s) > 63 {
		return false
	}
	switch {
	case s == "*":
		return true
	case strings.HasPrefix(s, "*-"):
		return dns1123Label(s[2:])
	case strings.HasPrefix(s, "*"):
		return dns1123Label(s[1:])
	}
	return dns1123Label(s)
}

func domainPreconditions(name string) error {
	if len(name) > 255 {
		return fmt.Errorf("domain name %q too long (max 255)", name)
	}
	if len(name) == 0 {
		return errors.New("empty domain name not allowed")
	}
	return nil
}

// dns1123Labels checks a domain's labels: DNS labels, the last one not all
// digits, a trailing dot allowed.
func dns1123Labels(domain string) error {
	parts := strings.Split(domain, ".")
	tld := parts[len(parts)-1]
	if _, err := strconv.Atoi(tld); err == nil {
		return fmt.Errorf("domain name %q invalid (top level domain %q cannot be all-numeric)", domain, tld)
	}
	for i, label := range parts {
		if i == len(parts)-1 && label == "" {
			return nil
		}
		if !dns1123Label(label) {
			return fmt.Errorf("domain name %q invalid (label %q invalid)", domain, label)
		}
	}
	return nil
}

// FQDN checks a fully qualified domain name.
func FQDN(name string) error {
	if err := domainPreconditions(name); err != nil {
		return err
	}
	return dns1123Labels(name)
}

// Host checks a host as Istio's rules take it (WildcardDomain): a domain
// whose leftmost label may be "*", "*foo" or "*-foo" and whose other
// labels are DNS labels. "a*b.example.com" and "foo.*.com" are refused.
func Host(host string) error {
	if err := domainPreconditions(host); err != nil {
		return err
	}
	first, rest, more := strings.Cut(host, ".")
	if !wildcardLabel(first) {
		return fmt.Errorf("domain name %q invalid (label %q invalid)", host, first)
	}
	if more {
		return dns1123Labels(rest)
	}
	return nil
}

// Duration checks a duration as Istio does: valid as a protobuf Duration,
// at least 1ms, in whole milliseconds.
func Duration(d *durationpb.Duration) error {
	if err := d.CheckValid(); err != nil {
		return fmt.Errorf("invalid duration: %w", err)
	}
	dur := d.AsDuration()
	if dur < time.Millisecond {
		return errors.New("duration must be greater than 1ms")
	}
	if dur%time.Millisecond != 0 {
		return errors.New("only durations to ms precision are supported")
	}
	return nil
}

// Percent checks an integer percentage.
func Percent(v int32) error {
	if v < 0 || v > 100 {
		return fmt.Errorf("percentage %v is not in range 0..100", v)
	}
	return nil
}

// Percentage checks a fractional percentage: 0, or 0.0001 to 100 (Envoy
// counts in millionths).
func Percentage(p *networkingapi.Percent) error {
	if p == nil {
		return nil
	}
	v := p.GetValue()
	if math.IsNaN(v) || v < 0 || v > 100 || (v > 0 && v < 0.0001) {
		return fmt.Errorf("percentage %v is neither 0.0, nor in range [0.0001, 100.0]", v)
	}
	return nil
}

// Port checks a port number.
func Port(port int64) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port number %d must be in the range 1..65535", port)
	}
	return nil
}

// labelKey: an optional DNS-name prefix and '/', then a qualified name
// (Kubernetes' label keys, as Istio checks them).
var (
	labelKeyRegexp   = regexp.MustCompile(`^([a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)*/)?((?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`)
	labelValueRegexp = regexp.MustCompile(`^((?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
)

// labels checks label keys and values (sourceLabels, subsets' labels,
// endpoints' labels).
func labels(l map[string]string) error {
	var out errs
	for _, k := range sortedKeys(l) {
		v := l[k]
		m := labelKeyRegexp.FindStringSubmatch(k)
		switch {
		case m == nil:
			out.addf("invalid tag key: %q", k)
		case len(m[1]) > 0 && len(m[1])-1 > 253:
			out.addf("invalid tag key: %q (DNS prefix is too long)", k)
		case len(m[2]) > 63:
			out.addf("invalid tag key: %q (name is too long)", k)
		}
		if !labelValueRegexp.MatchString(v) {
			out.addf("invalid tag value: %q", v)
		}
	}
	return out.err()
}

// selectorLabels checks a workload selector's labels: no empty key, no
// wildcard.
func selectorLabels(l map[string]string) error {
	var out errs
	for _, k := range sortedKeys(l) {
		v := l[k]
		if k == "" {
			out.addf("empty key is not supported in selector: %q", k+"="+v)
		}
		if strings.Contains(k, "*") || strings.Contains(v, "*") {
			out.addf("wildcard is not supported in selector: %q", k+"="+v)
		}
	}
	return out.err()
}

// exportTo checks exportTo: ".", "*", namespace names, and "~" (no one)
// for ServiceEntries only; no duplicates (". " is the own namespace), "*"
// and "~" alone; a DestinationRule with a workload selector only to its own
// namespace.
func exportTo(namespace string, to []string, serviceEntry, drWithSelector bool) error {
	if len(to) == 0 {
		return nil
	}
	var out errs
	seen := map[string]bool{}
	for _, e := range to {
		k := e
		if e == "." {
			k = namespace
		}
		switch {
		case seen[k] && k != e:
			out.addf("duplicate entries in exportTo: . and current namespace %s", namespace)
		case seen[k]:
			out.addf("duplicate entries in exportTo for entry %s", e)
		case e == "~" && serviceEntry, e == "*", e == ".":
			seen[k] = true
		case e == "~":
			out.addf("exportTo ~ (none) is not allowed for Istio configuration objects")
		case !dns1123Label(e):
			out.addf("only .,*, or a valid DNS 1123 label is allowed as exportTo entry")
		default:
			seen[k] = true
		}
	}
	if drWithSelector && len(seen) > 0 {
		if !seen[namespace] {
			out.addf("destination rule with workload selector cannot have exportTo beyond current namespace")
		} else if len(seen) > 1 {
			out.addf("destination rule with workload selector cannot have multiple entries in exportTo")
		}
	}
	if seen["*"] && len(to) > 1 {
		out.addf("cannot have both public (*) and non-public exportTo values for a resource")
	}
	if seen["~"] && len(to) > 1 {
		out.addf("cannot export service entry to no one (~) and someone")
	}
	return out.err()
}

// gatewayNames checks the gateways a VirtualService (or one of its
// matches) binds to: "mesh", "<namespace>/<name>", or a gateway's name or
// FQDN.
func gatewayNames(names []string) error {
	var out errs
	for _, g := range names {
		ns, name, ok := strings.Cut(g, "/")
		if !ok {
			out.add(FQDN(g))
			continue
		}
		if ns == "" || name == "" {
			out.addf("config namespace and gateway name cannot be empty")
		}
		if !dns1123Label(ns) {
			out.addf("invalid value for namespace: %q", ns)
		}
		if !dns1123Label(name) {
			out.addf("invalid value for gateway name: %q", name)
		}
	}
	return out.err()
}

// ipOrSubnet checks an address or a CIDR prefix.
func ipOrSubnet(s string) error {
	if strings.Count(s, "/") == 1 {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("%v is not a valid CIDR block", s)
		}
		return nil
	}
	if _, err := netip.ParseAddr(s); err != nil {
		return fmt.Errorf("%v is not a valid IP", s)
	}
	return nil
}

// portName checks a port name: a DNS label.
func portName(name string) error {
	if !dns1123Label(name) {
		return fmt.Errorf("invalid port name: %s", name)
	}
	return nil
}

// protocols are the port protocols Istio knows (case does not matter).
var protocols = []string{"grpc", "grpc-web", "http", "http_proxy", "http2", "https", "tcp", "tls", "udp", "mongo", "redis", "mysql", "hbone", "doublehbone"}

// protocol checks a port protocol; empty means detected.
func protocol(p string) error {
	if p != "" && !slices.Contains(protocols, strings.ToLower(p)) {
		return fmt.Errorf("unsupported protocol: %s", p)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
