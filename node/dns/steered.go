package dns

import (
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// steeredConn is a DNS UDP socket of a pod whose queries the eBPF
// redirection hands over unNATed (inpod.Pod.SocketMap). A query keeps the
// destination the client sent it to, a resolver's address and port 53,
// which the socket reads with each datagram (IP_ORIGDSTADDR,
// IPV6_ORIGDSTADDR; the inpod package asks for them), and its answer must
// come from there: a client's resolver takes answers only from the server
// it asked (glibc's socket is connected to it). No conntrack entry
// rewrites the answer's source as for a REDIRECTed query.
//
// The DNS library serves it as any net.PacketConn: ReadFrom returns the
// client and the destination together (*steeredQuery), which the library
// hands back to WriteTo with the answer.
type steeredConn struct {
	*net.UDPConn
	// own is the socket's address: a query sent to it is answered from it.
	own     netip.AddrPort
	replies *replySockets

	// rmu guards oob, the control-message buffer of one read; the
	// library reads from one goroutine, the lock only makes it safe.
	rmu sync.Mutex
	oob []byte
}

func newSteeredConn(c *net.UDPConn, replies *replySockets) *steeredConn {
	own := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return &steeredConn{
		UDPConn: c,
		own:     netip.AddrPortFrom(own.Addr().Unmap(), own.Port()),
		replies: replies,
		oob:     make([]byte, unix.CmsgSpace(unix.SizeofSockaddrInet6)+unix.CmsgSpace(unix.SizeofSockaddrInet4)),
	}
}

// steeredQuery is where a query came from and where it was sent.
type steeredQuery struct {
	client netip.AddrPort
	// dst is invalid when the datagram did not say.
	dst netip.AddrPort
}

func (q *steeredQuery) Network() string { return "udp" }
func (q *steeredQuery) String() string  { return q.client.String() }

// ReadFrom reads a query and where it came from and was sent (*steeredQuery).
func (c *steeredConn) ReadFrom(b []byte) (int, net.Addr, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, oobn, _, from, err := c.ReadMsgUDPAddrPort(b, c.oob)
	if err != nil {
		return n, nil, err
	}
	q := &steeredQuery{client: from}
	if dst, ok := origDst(c.oob[:oobn]); ok {
		q.dst = dst
	}
	return n, q, nil
}

// WriteTo answers a query (addr a *steeredQuery) from where it was sent: from
// this socket if it was sent here (the socket's own address, or its port
// where the socket is bound to no address), else from a socket bound to
// the server the client asked.
func (c *steeredConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	q, ok := addr.(*steeredQuery)
	if !ok {
		return c.UDPConn.WriteTo(b, addr)
	}
	if !q.dst.IsValid() || c.ownsDst(q.dst) {
		return c.WriteToUDPAddrPort(b, q.client)
	}
	return c.replies.send(b, q.dst, q.client)
}

func (c *steeredConn) ownsDst(dst netip.AddrPort) bool {
	return dst.Port() == c.own.Port() && (c.own.Addr().IsUnspecified() || dst.Addr().Unmap() == c.own.Addr())
}

// origDst reads a datagram's destination from its control messages: a
// sockaddr_in (IP_ORIGDSTADDR) or a sockaddr_in6 (IPV6_ORIGDSTADDR), the
// port in network order in both.
func origDst(oob []byte) (netip.AddrPort, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet4:
			port := binary.BigEndian.Uint16(m.Data[2:4])
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), port), true
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet6:
			port := binary.BigEndian.Uint16(m.Data[2:4])
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(m.Data[8:24])).Unmap(), port), true
		}
	}
	return netip.AddrPort{}, false
}

// maxReplySockets is how many answering sockets a pod keeps, one per
// server address its clients asked: a resolv.conf names at most three
// (glibc's MAXNS). Beyond them a pod's answer goes from a socket made for
// it and closed once sent.
const maxReplySockets = 8

// replySockets are one pod's sockets that answer its steered queries from
// the servers they were sent to (inpod.Pod.ListenTransparentUDP), kept for
// the next query to the same server: making one enters the pod's
// namespace, which costs more than the query. Its methods are safe for
// concurrent use.
type replySockets struct {
	open func(from netip.AddrPort) (*net.UDPConn, error)
	log  *slog.Logger

	mu     sync.Mutex
	socks  map[netip.AddrPort]*net.UDPConn
	warned bool
	closed bool
}

// send sends an answer to client from the server address from.
func (r *replySockets) send(b []byte, from, client netip.AddrPort) (int, error) {
	if from.Addr().Is4() {
		// The query came to a socket of both families.
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	}
	c, kept, err := r.get(from)
	if err != nil {
		return 0, err
	}
	if !kept {
		defer c.Close()
	}
	return c.WriteToUDPAddrPort(b, client)
}

// get returns the socket bound to from, and whether it is kept (else the
// caller closes it).
func (r *replySockets) get(from netip.AddrPort) (*net.UDPConn, bool, error) {
	r.mu.Lock()
	if c, ok := r.socks[from]; ok {
		r.mu.Unlock()
		return c, true, nil
	}
	r.mu.Unlock()
	// Outside the lock: the other answers go on meanwhile.
	c, err := r.open(from)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		// Every answer from there fails the same way (a proxy without
		// the right to bind port 53, say): say it once per pod.
		if !r.warned {
			r.warned = true
			r.log.Warn("cannot answer the pod's DNS queries from the server they were sent to", "server", from.String(), "err", err)
		}
		return nil, false, err
	}
	if r.closed {
		return c, false, nil
	}
	if kept, ok := r.socks[from]; ok { // made meanwhile by another answer
		c.Close()
		return kept, true, nil
	}
	if len(r.socks) >= maxReplySockets {
		return c, false, nil
	}
	if r.socks == nil {
		r.socks = map[netip.AddrPort]*net.UDPConn{}
	}
	r.socks[from] = c
	return c, true, nil
}

// close closes the kept sockets; later answers close theirs once sent.
// Called once the pod's DNS sockets are served no more, when no answer
// is under way.
func (r *replySockets) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, c := range r.socks {
		_ = c.Close()
	}
	r.socks = nil
}
