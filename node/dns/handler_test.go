package dns

import (
	"errors"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// FuzzHandle feeds arbitrary bytes to the query path as the DNS library
// would hand them over (those it unpacks and accepts): never a panic, an
// answer with the query's ID, and one that fits what the client takes.
func FuzzHandle(f *testing.F) {
	for _, q := range []*mdns.Msg{query("echo.demo.svc.cluster.local.", mdns.TypeA), query("x.example.com.", mdns.TypeSRV)} {
		b, _ := q.Pack()
		f.Add(b, false)
	}
	s, err := New(Config{
		Table:     workloadtable.New(),
		Upstreams: func(*inpod.Pod) (Upstream, error) { return Upstream{}, errors.New("none") },
	})
	if err != nil {
		f.Fatal(err)
	}
	p := &podServer{s: s, self: &workloadapi.Workload{Namespace: "demo"}, inFlight: make(chan struct{}, 1)}
	f.Fuzz(func(t *testing.T, b []byte, overTCP bool) {
		req := new(mdns.Msg)
		if req.Unpack(b) != nil {
			return
		}
		if len(b) < 12 {
			return
		}
		if action := mdns.DefaultMsgAcceptFunc(headerOf(b)); action != mdns.MsgAccept {
			return
		}
		network := "udp"
		if overTCP {
			network = "tcp"
		}
		resp := p.answer(req, network)
		if resp == nil {
			t.Fatal("a query dropped with nothing in flight")
		}
		truncate(resp, req, network)
		if resp.Id != req.Id {
			t.Fatalf("answer ID %d for query %d", resp.Id, req.Id)
		}
		out, err := resp.Pack()
		if err != nil {
			t.Fatalf("answer does not pack: %v", err)
		}
		if limit := udpLimit(req); network == "udp" && len(out) > limit {
			t.Fatalf("%d-byte UDP answer for a client taking %d", len(out), limit)
		}
	})
}

// headerOf reads the wire header the accept function looks at.
func headerOf(b []byte) mdns.Header {
	u16 := func(i int) uint16 { return uint16(b[i])<<8 | uint16(b[i+1]) }
	return mdns.Header{Id: u16(0), Bits: u16(2), Qdcount: u16(4), Ancount: u16(6), Nscount: u16(8), Arcount: u16(10)}
}

func udpLimit(req *mdns.Msg) int {
	if opt := req.IsEdns0(); opt != nil {
		return max(int(opt.UDPSize()), mdns.MinMsgSize)
	}
	return mdns.MinMsgSize
}
