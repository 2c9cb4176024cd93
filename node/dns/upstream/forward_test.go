package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// server is an upstream nameserver on 127.0.0.1, UDP and TCP on one port,
// that records the queries it gets.
type server struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  []query
}

type query struct {
	proto string
	msg   *dns.Msg
}

func (s *server) queries() []query {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]query(nil), s.got...)
}

func (s *server) protos() []string {
	var p []string
	for _, q := range s.queries() {
		p = append(p, q.proto)
	}
	return p
}

// listenPair opens UDP and TCP listeners on one free loopback port.
func listenPair(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		pc.Close()
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return nil, nil
}

// startServer runs handle for every query, over UDP and TCP, until the test
// ends. proto is "udp" or "tcp".
func startServer(t *testing.T, handle func(proto string, w dns.ResponseWriter, r *dns.Msg)) *server {
	t.Helper()
	pc, l := listenPair(t)
	s := &server{addr: netip.MustParseAddrPort(pc.LocalAddr().String())}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		proto := w.LocalAddr().Network()
		s.mu.Lock()
		s.got = append(s.got, query{proto, r})
		s.mu.Unlock()
		handle(proto, w, r)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started, done := make(chan struct{}), make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { done <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("start test nameserver: %v", err)
		}
		t.Cleanup(func() {
			if err := srv.Shutdown(); err != nil {
				t.Errorf("stop test nameserver: %v", err)
			}
			<-done
		})
	}
	return s
}

// blackhole is a nameserver that takes queries and never answers, over UDP
// and TCP (the listener is never accepted from; the kernel completes the
// handshake).
func blackhole(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, l := listenPair(t)
	t.Cleanup(func() { pc.Close(); l.Close() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// closedPort is a loopback port nothing listens on: UDP gets ICMP port
// unreachable, TCP a reset.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, l := listenPair(t)
	pc.Close()
	l.Close()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// observation is one call of ForwarderConfig.Observe.
type observation struct {
	proto string
	err   bool
}

type observer struct {
	mu  sync.Mutex
	got []observation
}

func (o *observer) observe(proto string, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, observation{proto, err != nil})
}

func (o *observer) calls() []observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]observation(nil), o.got...)
}

func newForwarder(t *testing.T, cfg ForwarderConfig, ns ...netip.AddrPort) *Forwarder {
	t.Helper()
	cfg.Nameservers = ns
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	f, err := NewForwarder(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func question(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// answerA answers every query with one A record.
func answerA(_ string, w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 7)})
	_ = w.WriteMsg(m)
}

func packed(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func withID(b []byte, id uint16) []byte {
	b = bytes.Clone(b)
	binary.BigEndian.PutUint16(b, id)
	return b
}

// TestForwardVerbatim relays an SRV query with EDNS options and an answer
// with flags, authority and additional records: both cross unchanged but
// for the ID (istio#55490 re-resolved such answers and changed them).
func TestForwardVerbatim(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{UDP, TCP} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var sent []byte // the answer as the upstream put it on the wire
			srv := startServer(t, func(_ string, w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetReply(r)
				m.Authoritative, m.RecursionAvailable, m.AuthenticatedData = true, true, true
				name := r.Question[0].Name
				m.Answer = []dns.RR{
					&dns.SRV{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 17}, Priority: 10, Weight: 60, Port: 8443, Target: "b.Backend.example."},
					&dns.SRV{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 3599}, Priority: 20, Weight: 0, Port: 80, Target: "a.backend.example."},
				}
				m.Ns = []dns.RR{&dns.NS{Hdr: dns.RR_Header{Name: "example.", Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: 86400}, Ns: "ns1.example."}}
				m.Extra = []dns.RR{
					&dns.A{Hdr: dns.RR_Header{Name: "a.backend.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(192, 0, 2, 1)},
					&dns.AAAA{Hdr: dns.RR_Header{Name: "b.Backend.example.", Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 6}, AAAA: net.ParseIP("2001:db8::2")},
				}
				opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
				opt.SetUDPSize(1232)
				opt.SetDo()
				opt.Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708a1a2a3a4a5a6a7a8"}}
				m.Extra = append(m.Extra, opt)
				b, err := m.Pack()
				if err != nil {
					panic(err)
				}
				mu.Lock()
				sent = b
				mu.Unlock()
				_, _ = w.Write(b)
			})
			req := question("_https._tcp.Svc.example.", dns.TypeSRV)
			req.Id = 0xbeef
			req.CheckingDisabled = true
			req.SetEdns0(4096, true)
			opt := req.IsEdns0()
			opt.Option = []dns.EDNS0{
				&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
				&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(198, 51, 100, 0).To4()},
				&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("canopy")},
			}
			obs := &observer{}
			f := newForwarder(t, ForwarderConfig{Observe: obs.observe}, srv.addr)

			got, err := f.Forward(t.Context(), req, proto)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if got.Id != 0xbeef {
				t.Errorf("answer ID %#x, want the client's 0xbeef", got.Id)
			}
			if want := withID(sent, 0xbeef); !bytes.Equal(packed(t, got), want) {
				want := new(dns.Msg)
				_ = want.Unpack(withID(sent, 0xbeef))
				t.Errorf("answer changed on the way (-upstream +relayed):\n%s", cmp.Diff(want.String(), got.String()))
			}

			qs := srv.queries()
			if len(qs) != 1 || qs[0].proto != proto {
				t.Fatalf("upstream got %v, want one query over %s", srv.protos(), proto)
			}
			upID := qs[0].msg.Id
			if !bytes.Equal(packed(t, qs[0].msg), withID(packed(t, req), upID)) {
				t.Errorf("query changed on the way (-client +upstream):\n%s", cmp.Diff(req.String(), qs[0].msg.String()))
			}
			if diff := cmp.Diff([]observation{{proto, false}}, obs.calls(), cmp.AllowUnexported(observation{})); diff != "" {
				t.Errorf("Observe calls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForwardNoEDNS: a query without OPT goes up without one, and an OPT
// the upstream adds anyway is not passed to a client that cannot read it.
func TestForwardNoEDNS(t *testing.T) {
	t.Parallel()
	srv := startServer(t, func(_ string, w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.SetEdns0(1232, false)
		_ = w.WriteMsg(m)
	})
	f := newForwarder(t, ForwarderConfig{}, srv.addr)
	got, err := f.Forward(t.Context(), question("plain.example.", dns.TypeA), UDP)
	if err != nil {
		t.Fatal(err)
	}
	if got.IsEdns0() != nil {
		t.Errorf("answer to a query without EDNS carries an OPT record:\n%v", got)
	}
	if qs := srv.queries(); len(qs) != 1 || qs[0].msg.IsEdns0() != nil {
		t.Errorf("upstream got %v, want one query without OPT", qs)
	}
}

// bigAnswer answers with n A records, truncated over UDP to the size the
// query allows (512 without EDNS) as a real server does.
func bigAnswer(n int) func(string, dns.ResponseWriter, *dns.Msg) {
	return func(proto string, w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for i := range n {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(10, 0, byte(i>>8), byte(i))})
		}
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), false)
			size = max(size, int(opt.UDPSize()))
		}
		if proto == "udp" {
			m.Truncate(size)
		}
		_ = w.WriteMsg(m)
	}
}

// TestForwardLargeAnswers: an answer the UDP upstream truncates is fetched
// over TCP, and an answer that fits the query's EDNS size comes over UDP
// whole, however far over 512 bytes (istio#61371 read it into 512 bytes and
// answered SERVFAIL).
func TestForwardLargeAnswers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		edns       uint16 // 0: no OPT
		records    int    // 16 bytes each, uncompressed
		wantProtos []string
	}{
		{"no EDNS, 800 bytes: truncated, then TCP", 0, 50, []string{UDP, TCP}},
		{"EDNS 1232, 3000 bytes: truncated, then TCP", 1232, 190, []string{UDP, TCP}},
		{"EDNS 1232, 1000 bytes: over UDP", 1232, 60, []string{UDP}},
		{"EDNS 4096, 3000 bytes: over UDP", 4096, 190, []string{UDP}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, bigAnswer(tt.records))
			obs := &observer{}
			f := newForwarder(t, ForwarderConfig{Observe: obs.observe}, srv.addr)
			req := question("many.example.", dns.TypeA)
			if tt.edns != 0 {
				req.SetEdns0(tt.edns, false)
			}
			got, err := f.Forward(t.Context(), req, UDP)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			if got.Truncated || len(got.Answer) != tt.records {
				t.Errorf("answer TC=%v with %d records, want whole with %d", got.Truncated, len(got.Answer), tt.records)
			}
			if diff := cmp.Diff(tt.wantProtos, srv.protos()); diff != "" {
				t.Errorf("upstream queries by network (-want +got):\n%s", diff)
			}
			var wantObs []observation
			for _, p := range tt.wantProtos {
				wantObs = append(wantObs, observation{p, false})
			}
			if diff := cmp.Diff(wantObs, obs.calls(), cmp.AllowUnexported(observation{})); diff != "" {
				t.Errorf("Observe calls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForwardTCPQueryOverTCP: a query that came over TCP is never sent over
// UDP, where its answer could be cut.
func TestForwardTCPQueryOverTCP(t *testing.T) {
	t.Parallel()
	srv := startServer(t, bigAnswer(300))
	f := newForwarder(t, ForwarderConfig{}, srv.addr)
	got, err := f.Forward(t.Context(), question("many.example.", dns.TypeA), TCP)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Answer) != 300 {
		t.Errorf("%d records, want 300", len(got.Answer))
	}
	if diff := cmp.Diff([]string{TCP}, srv.protos()); diff != "" {
		t.Errorf("upstream queries by network (-want +got):\n%s", diff)
	}
}

// TestForwardRcodes: an upstream's RCODE is its answer, passed through as
// it is; the next nameserver is not asked.
func TestForwardRcodes(t *testing.T) {
	t.Parallel()
	for _, rcode := range []int{dns.RcodeNameError, dns.RcodeRefused, dns.RcodeServerFailure, dns.RcodeNotImplemented} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			t.Parallel()
			first := startServer(t, func(_ string, w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetRcode(r, rcode)
				m.RecursionAvailable = true
				m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "example.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 300},
					Ns: "ns1.example.", Mbox: "hostmaster.example.", Serial: 2026080101, Refresh: 7200, Retry: 900, Expire: 1209600, Minttl: 60}}
				_ = w.WriteMsg(m)
			})
			second := startServer(t, answerA)
			f := newForwarder(t, ForwarderConfig{}, first.addr, second.addr)
			got, err := f.Forward(t.Context(), question("missing.example.", dns.TypeAAAA), UDP)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			if got.Rcode != rcode || len(got.Ns) != 1 || got.Ns[0].Header().Rrtype != dns.TypeSOA {
				t.Errorf("answer %v, want %s with the SOA", got, dns.RcodeToString[rcode])
			}
			if n := len(second.queries()); n != 0 {
				t.Errorf("second nameserver asked %d times after an answer from the first", n)
			}
		})
	}
}

// TestForwardFailover: a first nameserver that refuses, never answers, or
// answers another question gives way to the second.
func TestForwardFailover(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	for _, tt := range []struct {
		name        string
		first       func(t *testing.T) netip.AddrPort
		proto       string
		minDuration time.Duration
	}{
		{"closed UDP port", closedPort, UDP, 0},
		{"closed TCP port", closedPort, TCP, 0},
		{"UDP blackhole", blackhole, UDP, timeout},
		{"TCP blackhole", blackhole, TCP, timeout},
		{"answer to another question", func(t *testing.T) netip.AddrPort {
			return startServer(t, func(_ string, w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetReply(r)
				m.Question[0].Name = "other.example."
				_ = w.WriteMsg(m)
			}).addr
		}, UDP, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			second := startServer(t, answerA)
			obs := &observer{}
			f := newForwarder(t, ForwarderConfig{Timeout: timeout, Observe: obs.observe}, tt.first(t), second.addr)
			start := time.Now()
			got, err := f.Forward(t.Context(), question("svc.example.", dns.TypeA), tt.proto)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			if len(got.Answer) != 1 {
				t.Errorf("answer %v, want the second nameserver's A", got)
			}
			if took < tt.minDuration || took > tt.minDuration+time.Second {
				t.Errorf("took %v, want about %v", took, tt.minDuration)
			}
			want := []observation{{tt.proto, true}, {tt.proto, false}}
			if diff := cmp.Diff(want, obs.calls(), cmp.AllowUnexported(observation{})); diff != "" {
				t.Errorf("Observe calls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForwardForgedDatagram: a datagram that is not the answer (another ID)
// is ignored, and the answer that follows it is taken.
func TestForwardForgedDatagram(t *testing.T) {
	t.Parallel()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil {
			return
		}
		forged := new(dns.Msg)
		forged.SetReply(q)
		forged.Id++
		forged.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.IPv4(203, 0, 113, 66)}}
		genuine := new(dns.Msg)
		genuine.SetReply(q)
		genuine.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.IPv4(192, 0, 2, 7)}}
		for _, m := range []*dns.Msg{forged, genuine} {
			b, _ := m.Pack()
			_, _ = pc.WriteTo(b, from)
		}
	}()
	f := newForwarder(t, ForwarderConfig{}, netip.MustParseAddrPort(pc.LocalAddr().String()))
	got, err := f.Forward(t.Context(), question("svc.example.", dns.TypeA), UDP)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Answer) != 1 || !got.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 7)) {
		t.Errorf("answer %v, want the real one", got)
	}
}

// TestForwardAllDown: when no nameserver answers, Forward fails within
// attempts × nameservers × timeout, wrapping ErrUpstream and the cause.
func TestForwardAllDown(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	for _, tt := range []struct {
		name  string
		ns    func(t *testing.T) netip.AddrPort
		cause func(error) bool
		bound time.Duration
	}{
		{"blackholes", blackhole, func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }, 2 * 2 * timeout},
		{"closed ports", closedPort, func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newForwarder(t, ForwarderConfig{Timeout: timeout, Attempts: 2}, tt.ns(t), tt.ns(t))
			start := time.Now()
			got, err := f.Forward(t.Context(), question("svc.example.", dns.TypeA), UDP)
			took := time.Since(start)
			if !errors.Is(err, ErrUpstream) || !tt.cause(err) {
				t.Fatalf("Forward = %v, %v; want ErrUpstream wrapping the cause", got, err)
			}
			if took < tt.bound || took > tt.bound+time.Second {
				t.Errorf("failed after %v, want about %v", took, tt.bound)
			}
		})
	}
}

// TestForwardCancel: a cancelled context ends a query waiting on an upstream
// at once.
func TestForwardCancel(t *testing.T) {
	t.Parallel()
	f := newForwarder(t, ForwarderConfig{Timeout: time.Minute}, blackhole(t))
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := f.Forward(ctx, question("svc.example.", dns.TypeA), UDP)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Forward error %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned %v after the start, want about 100ms", took)
	}
}

// TestForwardBusy holds queries at the upstream until MaxInFlight are in
// flight: the next fails with ErrBusy at once, and the slots come back.
func TestForwardBusy(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := startServer(t, func(proto string, w dns.ResponseWriter, r *dns.Msg) {
		<-release
		answerA(proto, w, r)
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the server stops, which waits for its handlers
	const limit = 3
	f := newForwarder(t, ForwarderConfig{MaxInFlight: limit, Timeout: 10 * time.Second}, srv.addr)

	errs := make(chan error, limit)
	for i := range limit {
		go func() {
			_, err := f.Forward(context.Background(), question(fmt.Sprintf("q%d.example.", i), dns.TypeA), UDP)
			errs <- err
		}()
	}
	eventually.True(t, "all queries held at the upstream", func() bool { return len(srv.queries()) == limit })

	start := time.Now()
	if _, err := f.Forward(t.Context(), question("one-more.example.", dns.TypeA), UDP); !errors.Is(err, ErrBusy) {
		t.Errorf("Forward past the limit: %v, want ErrBusy", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("ErrBusy after %v, want at once", took)
	}
	free()
	for range limit {
		if err := <-errs; err != nil {
			t.Errorf("held query: %v", err)
		}
	}
	if _, err := f.Forward(t.Context(), question("after.example.", dns.TypeA), UDP); err != nil {
		t.Errorf("Forward once the queries ended: %v", err)
	}
}

// TestForwardNoLeak runs every path of Forward (answers over UDP and TCP, a
// TCP retry, timeouts, refusals, cancellation, ErrBusy) and then finds the
// goroutines back at their number before.
func TestForwardNoLeak(t *testing.T) {
	// Not parallel: the count must see no other test's goroutines come
	// and go.
	base := runtime.NumGoroutine()
	t.Run("paths", func(t *testing.T) {
		ok := startServer(t, bigAnswer(50))
		release := make(chan struct{})
		slow := startServer(t, func(proto string, w dns.ResponseWriter, r *dns.Msg) { <-release; answerA(proto, w, r) })
		t.Cleanup(func() { close(release) })
		down, refused := blackhole(t), closedPort(t)
		f := newForwarder(t, ForwarderConfig{Timeout: 100 * time.Millisecond, Attempts: 1, MaxInFlight: 1}, down, refused, ok.addr)
		for _, proto := range []string{UDP, TCP} {
			if _, err := f.Forward(t.Context(), question("many.example.", dns.TypeA), proto); err != nil {
				t.Errorf("Forward over %s: %v", proto, err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := f.Forward(ctx, question("x.example.", dns.TypeA), UDP); !errors.Is(err, context.Canceled) {
			t.Errorf("Forward with a cancelled context: %v", err)
		}
		held := newForwarder(t, ForwarderConfig{MaxInFlight: 1}, slow.addr)
		done := make(chan error, 1)
		go func() {
			_, err := held.Forward(context.Background(), question("held.example.", dns.TypeA), UDP)
			done <- err
		}()
		eventually.True(t, "query held at the upstream", func() bool { return len(slow.queries()) == 1 })
		if _, err := held.Forward(t.Context(), question("busy.example.", dns.TypeA), UDP); !errors.Is(err, ErrBusy) {
			t.Errorf("Forward past the limit: %v", err)
		}
		release <- struct{}{} // the held handler's turn
		if err := <-done; err != nil {
			t.Errorf("held query: %v", err)
		}
	})
	if !goroutinesBackTo(base, 5*time.Second) {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after:\n%s", base, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
}

func TestNewForwarderErrors(t *testing.T) {
	t.Parallel()
	dial := (&net.Dialer{}).DialContext
	ns := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}
	for _, tt := range []struct {
		name string
		cfg  ForwarderConfig
	}{
		{"no nameserver", ForwarderConfig{Dial: dial}},
		{"invalid nameserver", ForwarderConfig{Dial: dial, Nameservers: []netip.AddrPort{{}}}},
		{"port 0", ForwarderConfig{Dial: dial, Nameservers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}}},
		{"no Dial", ForwarderConfig{Nameservers: ns}},
		{"negative timeout", ForwarderConfig{Dial: dial, Nameservers: ns, Timeout: -1}},
		{"negative attempts", ForwarderConfig{Dial: dial, Nameservers: ns, Attempts: -1}},
		{"negative max in flight", ForwarderConfig{Dial: dial, Nameservers: ns, MaxInFlight: -1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewForwarder(tt.cfg, nil); err == nil {
				t.Error("NewForwarder succeeded")
			}
		})
	}
	f, err := NewForwarder(ForwarderConfig{Dial: dial, Nameservers: ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Forward(t.Context(), question("x.example.", dns.TypeA), "sctp"); err == nil {
		t.Error("Forward over sctp succeeded")
	}
}
