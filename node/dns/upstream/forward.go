package upstream

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// The networks a query comes over and goes upstream over.
const (
	UDP = "udp"
	TCP = "tcp"
)

// Defaults of a ForwarderConfig left zero.
const (
	// DefaultTimeout bounds one try with one nameserver. Two tries fit
	// in the 5 s a glibc client waits before it asks again.
	DefaultTimeout = 2 * time.Second
	// DefaultAttempts is two rounds over the nameservers, so that one
	// lost datagram does not become a SERVFAIL that a client takes as
	// final.
	DefaultAttempts = 2
	// DefaultMaxInFlight bounds the queries of one pod in flight at once.
	DefaultMaxInFlight = 64
)

// minUDPBuffer is the smallest answer a UDP read takes whole: the EDNS size
// DNS Flag Day 2020 settled on. Answers to a query without EDNS fit in 512
// bytes, and a query with EDNS may allow more, which the buffer then follows.
const minUDPBuffer = 1232

// headerLen is the size of a DNS message header.
const headerLen = 12

var (
	// ErrBusy is a query refused at once because MaxInFlight queries are
	// in flight; the caller answers it SERVFAIL.
	ErrBusy = errors.New("too many DNS queries in flight")
	// ErrUpstream is a query that no nameserver answered in any attempt;
	// the error wraps the last try's cause too.
	ErrUpstream = errors.New("no upstream nameserver answered")
)

// ForwarderConfig says where and how a Forwarder sends queries.
type ForwarderConfig struct {
	// Nameservers are the upstreams, asked in this order; at least one.
	Nameservers []netip.AddrPort
	// Dial connects to an upstream. The node proxy passes the pod's
	// inpod.Pod.Dial, so that queries leave from the pod's network
	// namespace, with the mark its DNS capture lets pass, to resolvers
	// the pod can reach. Required.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout bounds one try with one nameserver, including the TCP
	// query after a truncated UDP answer; DefaultTimeout when zero.
	Timeout time.Duration
	// Attempts is how many rounds over the nameservers a query gets;
	// DefaultAttempts when zero.
	Attempts int
	// MaxInFlight is how many Forward calls may run at once; more fail
	// with ErrBusy. DefaultMaxInFlight when zero.
	MaxInFlight int
	// Observe, when set, is called after every exchange with an
	// upstream, with the network it used ("udp" or "tcp"), how long it
	// took and its error: nil for any answer, whatever its RCODE, and
	// for a truncated UDP answer that a TCP exchange follows. It must be
	// safe for concurrent use and quick; it runs on the query's path.
	Observe func(proto string, took time.Duration, err error)
}

// Forwarder relays queries to upstream nameservers and returns their
// answers unchanged but for the ID. It is safe for concurrent use.
type Forwarder struct {
	nameservers []string
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout     time.Duration
	attempts    int
	observe     func(proto string, took time.Duration, err error)
	// slots holds a token per Forward in flight.
	slots chan struct{}
	log   *slog.Logger
}

// NewForwarder checks cfg and returns a Forwarder. A nil log discards.
func NewForwarder(cfg ForwarderConfig, log *slog.Logger) (*Forwarder, error) {
	if len(cfg.Nameservers) == 0 {
		return nil, errors.New("new DNS forwarder: no nameserver")
	}
	if cfg.Dial == nil {
		return nil, errors.New("new DNS forwarder: no Dial")
	}
	if cfg.Timeout < 0 || cfg.Attempts < 0 || cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("new DNS forwarder: negative timeout %v, attempts %d or max in flight %d", cfg.Timeout, cfg.Attempts, cfg.MaxInFlight)
	}
	f := &Forwarder{
		dial:     cfg.Dial,
		timeout:  cmp.Or(cfg.Timeout, DefaultTimeout),
		attempts: cmp.Or(cfg.Attempts, DefaultAttempts),
		observe:  cfg.Observe,
		slots:    make(chan struct{}, cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight)),
		log:      log,
	}
	for _, ns := range cfg.Nameservers {
		if !ns.IsValid() || ns.Port() == 0 {
			return nil, fmt.Errorf("new DNS forwarder: nameserver %v is not an address and port", ns)
		}
		f.nameservers = append(f.nameservers, ns.String())
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.log = f.log.With("component", "dns-forwarder")
	return f, nil
}

// Forward sends req to the nameservers and returns the first answer.
//
// proto is the network req came over, UDP or TCP; a TCP query goes upstream
// over TCP, a UDP one over UDP and again over TCP to the same nameserver
// when the answer comes back truncated (TC). The query goes as the client
// sent it, EDNS options included, under a new random ID; no OPT record is
// added, so an upstream answers a query without one within 512 bytes or
// truncated. The answer is the upstream's as it came, any RCODE included,
// with req's ID, and without an OPT record if req had none (RFC 6891
// forbids one there). Fitting it to the client's size is the caller's job.
//
// Nameservers are asked in order, for Attempts rounds, each try bounded by
// Timeout; an error, a timeout or an answer to a different question moves
// on to the next. When all fail the error wraps ErrUpstream and the last
// cause; when ctx ends first, ctx's error. More than MaxInFlight calls at
// once fail with ErrBusy without trying. req is packed, not kept; the
// caller must not change it during the call.
func (f *Forwarder) Forward(ctx context.Context, req *dns.Msg, proto string) (*dns.Msg, error) {
	if proto != UDP && proto != TCP {
		return nil, fmt.Errorf("forward query over %q: want %q or %q", proto, UDP, TCP)
	}
	if req == nil {
		return nil, errors.New("forward query: nil message")
	}
	select {
	case f.slots <- struct{}{}:
		defer func() { <-f.slots }()
	default:
		return nil, ErrBusy
	}
	query, err := req.Pack()
	if err != nil {
		return nil, fmt.Errorf("pack query: %w", err)
	}
	if len(query) > dns.MaxMsgSize {
		return nil, fmt.Errorf("forward query of %d bytes: over the DNS maximum", len(query))
	}
	bufSize := minUDPBuffer
	if opt := req.IsEdns0(); opt != nil {
		bufSize = max(bufSize, int(opt.UDPSize()))
	}
	var last error
	for attempt := 1; attempt <= f.attempts; attempt++ {
		for _, ns := range f.nameservers {
			if last != nil {
				f.log.Debug("upstream try failed, trying the next", "proto", proto, slog.Any("err", last))
			}
			resp, err := f.try(ctx, ns, proto, query, bufSize, req)
			if err == nil {
				return answer(req, resp), nil
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("forward query: %w (last try: %w)", ctx.Err(), err)
			}
			last = fmt.Errorf("attempt %d: %w", attempt, err)
		}
	}
	return nil, fmt.Errorf("%w (%d nameservers, %d attempts): %w", ErrUpstream, len(f.nameservers), f.attempts, last)
}

// answer gives resp the client's ID and, for a client without EDNS, no OPT
// record and only the RCODE bits a header holds.
func answer(req, resp *dns.Msg) *dns.Msg {
	resp.Id = req.Id
	if req.IsEdns0() == nil {
		resp.Extra = slices.DeleteFunc(resp.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeOPT })
		resp.Rcode &= 0xF
	}
	return resp
}

// try is one nameserver's turn: one exchange over proto, and over TCP after
// a truncated UDP answer, within one timeout.
func (f *Forwarder) try(ctx context.Context, ns, proto string, query []byte, bufSize int, req *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if proto == UDP {
		resp, truncated, err := f.exchange(ctx, UDP, ns, query, bufSize, req)
		if err != nil || !truncated {
			return resp, err
		}
	}
	resp, _, err := f.exchange(ctx, TCP, ns, query, 0, req)
	return resp, err
}

// exchange sends query to ns over network on a connection of its own and
// reads the answer; truncated reports a UDP answer with TC set or larger
// than bufSize, which is not unpacked.
func (f *Forwarder) exchange(ctx context.Context, network, ns string, query []byte, bufSize int, req *dns.Msg) (resp *dns.Msg, truncated bool, err error) {
	start := time.Now()
	if f.observe != nil {
		defer func() { f.observe(network, time.Since(start), err) }()
	}
	conn, err := f.dial(ctx, network, ns)
	if err != nil {
		return nil, false, fmt.Errorf("dial %s %s: %w", network, ns, err)
	}
	defer conn.Close()
	// The deadline bounds every read and write; a cancelled ctx moves it
	// to now, so that a blocked read returns at once.
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return nil, false, fmt.Errorf("set deadline on %s %s: %w", network, ns, err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	// A fresh random ID (and, for UDP, a fresh socket and source port)
	// per exchange: the client's ID may be guessable, and an answer
	// forged for it must not pass.
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	if network == UDP {
		resp, truncated, err = exchangeUDP(conn, query, id, bufSize, req)
	} else {
		resp, err = exchangeTCP(conn, query, id, req)
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s exchange with %s: %w", network, ns, err)
	}
	return resp, truncated, nil
}

func exchangeUDP(conn net.Conn, query []byte, id uint16, bufSize int, req *dns.Msg) (*dns.Msg, bool, error) {
	msg := slices.Clone(query)
	binary.BigEndian.PutUint16(msg, id)
	if _, err := conn.Write(msg); err != nil {
		return nil, false, fmt.Errorf("send: %w", err)
	}
	// One byte more than allowed tells a datagram that was cut.
	buf := make([]byte, bufSize+1)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, false, fmt.Errorf("receive: %w", err)
		}
		a := buf[:n]
		// Not an answer to this query: ignored, the real one may
		// still come.
		if n < headerLen || binary.BigEndian.Uint16(a) != id || a[2]&0x80 == 0 {
			continue
		}
		if n > bufSize || a[2]&0x02 != 0 { // TC
			return nil, true, nil
		}
		resp, err := parseAnswer(a, req)
		return resp, false, err
	}
}

func exchangeTCP(conn net.Conn, query []byte, id uint16, req *dns.Msg) (*dns.Msg, error) {
	// Length and message in one write: one segment for a small query.
	msg := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(msg, uint16(len(query)))
	copy(msg[2:], query)
	binary.BigEndian.PutUint16(msg[2:], id)
	if _, err := conn.Write(msg); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	var l [2]byte
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return nil, fmt.Errorf("receive length: %w", err)
	}
	a := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(conn, a); err != nil {
		return nil, fmt.Errorf("receive answer: %w", err)
	}
	if len(a) < headerLen || binary.BigEndian.Uint16(a) != id || a[2]&0x80 == 0 {
		return nil, errors.New("not an answer to the query")
	}
	return parseAnswer(a, req)
}

// errOtherQuestion is an answer whose question section is not the query's.
var errOtherQuestion = errors.New("answer to another question")

// parseAnswer unpacks an answer to req. An answer without a question section
// is accepted: servers send FORMERR and REFUSED so.
func parseAnswer(b []byte, req *dns.Msg) (*dns.Msg, error) {
	resp := new(dns.Msg)
	if err := resp.Unpack(b); err != nil {
		return nil, fmt.Errorf("unpack answer: %w", err)
	}
	if len(resp.Question) == 0 {
		return resp, nil
	}
	if len(resp.Question) != len(req.Question) {
		return nil, errOtherQuestion
	}
	for i, q := range resp.Question {
		r := req.Question[i]
		if q.Qtype != r.Qtype || q.Qclass != r.Qclass || !strings.EqualFold(q.Name, r.Name) {
			return nil, errOtherQuestion
		}
	}
	return resp, nil
}
