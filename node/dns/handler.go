package dns

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/canopy-mesh/canopy/node/dns/authority"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TTL is the time to live of the records the server answers itself: short,
// so that a client never holds a mesh address long after it changed.
const TTL = 30

// handler answers the queries arriving over network ("udp", "tcp").
func (p *podServer) handler(network string) mdns.HandlerFunc {
	return func(w mdns.ResponseWriter, req *mdns.Msg) {
		resp := p.answer(req, network)
		if resp == nil {
			return
		}
		truncate(resp, req, network)
		_ = w.WriteMsg(resp)
	}
}

// answer is the answer to req: the mesh's own, else the pod's resolvers';
// nil when the query is dropped. The DNS library turns away most of what
// is not one query before it gets here, not all: a NOTIFY passes, and a
// header may count a question the message does not hold.
func (p *podServer) answer(req *mdns.Msg, network string) *mdns.Msg {
	switch {
	case req.Opcode != mdns.OpcodeQuery:
		return reply(req, mdns.RcodeNotImplemented)
	case len(req.Question) != 1:
		return reply(req, mdns.RcodeFormatError)
	}
	self := p.current()
	labels := p.s.metrics.labels(req.Question[0].Qtype, network, self)
	p.s.metrics.requests.With(labels).Inc()
	if resp, ok := p.authoritative(req, self); ok {
		return resp
	}
	// Only forwarded queries wait, so only they take a slot: a pod
	// whose resolvers are slow, or that floods them, still gets its
	// mesh names at once.
	select {
	case p.inFlight <- struct{}{}:
		defer func() { <-p.inFlight }()
	default:
		p.s.metrics.dropped.WithLabelValues(reasonInFlight).Inc()
		if network == "tcp" {
			// A TCP client waits for an answer: tell it now.
			return reply(req, mdns.RcodeServerFailure)
		}
		return nil
	}
	p.s.metrics.upstreamRequests.With(labels).Inc()
	start := time.Now()
	resp, err := p.forward(req, network)
	p.s.metrics.upstreamDuration.With(labels).Observe(time.Since(start).Seconds())
	if err != nil {
		p.s.metrics.upstreamFailures.With(labels).Inc()
		p.s.log.Debug("forwarding failed", "pod", self.GetNamespace()+"/"+self.GetName(), "name", req.Question[0].Name, "err", err)
		return reply(req, mdns.RcodeServerFailure)
	}
	resp.Id = req.Id
	return resp
}

// authoritative answers a mesh name's A or AAAA query.
func (p *podServer) authoritative(req *mdns.Msg, self *workloadapi.Workload) (*mdns.Msg, bool) {
	q := req.Question[0]
	var fam authority.Family
	switch {
	case q.Qclass != mdns.ClassINET:
		return nil, false
	case q.Qtype == mdns.TypeA:
		fam = authority.IPv4
	case q.Qtype == mdns.TypeAAAA:
		fam = authority.IPv6
	default:
		return nil, false
	}
	client := authority.Client{Namespace: self.GetNamespace(), Network: self.GetNetwork()}
	ans, ok := authority.Lookup(p.s.cfg.Table, p.s.cfg.ClusterDomain, client, q.Name, fam)
	if !ok {
		return nil, false
	}
	resp := reply(req, mdns.RcodeSuccess)
	resp.Authoritative = true
	owner := q.Name
	if ans.CNAME != "" {
		target := mdns.Fqdn(ans.CNAME)
		resp.Answer = append(resp.Answer, &mdns.CNAME{Hdr: header(owner, mdns.TypeCNAME), Target: target})
		owner = target
	}
	// A different order each time spreads the clients that take the
	// first address over all of them.
	addrs := append([]netip.Addr(nil), ans.Addrs...)
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	for _, a := range addrs {
		if a.Is4() {
			resp.Answer = append(resp.Answer, &mdns.A{Hdr: header(owner, mdns.TypeA), A: a.AsSlice()})
		} else {
			resp.Answer = append(resp.Answer, &mdns.AAAA{Hdr: header(owner, mdns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return resp, true
}

func header(name string, rrtype uint16) mdns.RR_Header {
	return mdns.RR_Header{Name: name, Rrtype: rrtype, Class: mdns.ClassINET, Ttl: TTL}
}

// forward relays req to the pod's resolvers, bounded by ForwardTimeout.
func (p *podServer) forward(req *mdns.Msg, network string) (*mdns.Msg, error) {
	fwd, err := p.forwarder()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.s.lim.ForwardTimeout)
	defer cancel()
	resp, err := fwd.Forward(ctx, req, network)
	if err == nil && resp == nil {
		err = errors.New("no answer")
	}
	return resp, err
}

// reply is an answer to req with rcode and nothing else, its EDNS
// mirroring the query's.
func reply(req *mdns.Msg, rcode int) *mdns.Msg {
	resp := new(mdns.Msg)
	resp.SetRcode(req, rcode)
	resp.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(max(opt.UDPSize(), mdns.MinMsgSize), opt.Do())
	}
	return resp
}

// truncate fits resp to what the client can take: over UDP 512 bytes
// unless its query advertised more with EDNS, over TCP a whole message.
// What does not fit is dropped and TC set, so that the client asks
// again over TCP; an answer over 512 bytes sent whole to a client that
// reads 512 would leave it waiting.
func truncate(resp, req *mdns.Msg, network string) {
	size := mdns.MaxMsgSize
	if network == "udp" {
		size = mdns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), mdns.MinMsgSize)
		}
	}
	resp.Truncate(size)
}
