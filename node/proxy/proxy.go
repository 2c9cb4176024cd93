// Package proxy is the node proxy's data path for one pod at a time: outbound
// connections captured on 15001 go to their destination over HBONE (or plain
// TCP for destinations outside the mesh), inbound HBONE on 15008 is
// authenticated, authorized (docs/wire-contract.md §1.8) and carried to the
// app, inbound plaintext on 15006 is authorized with no identity.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/internal/origdst"
	"github.com/canopy-mesh/canopy/node/authz"
	"github.com/canopy-mesh/canopy/node/hbone"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/node/route"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Table is the workload table as the data path reads it;
// *workloadtable.Table implements it.
type Table interface {
	route.Table
	Workload(uid string) *workloadapi.Workload
	Policies() []*security.Authorization
	// Changed is closed by the next change to the table.
	Changed() <-chan struct{}
}

// current is the pod's workload as xDS has it now: its policies, waypoint
// and services change after the pod started being served.
func (p *Proxy) current(w *workloadapi.Workload) *workloadapi.Workload {
	if cur := p.Table.Workload(w.GetUid()); cur != nil {
		return cur
	}
	return w
}

// Certs are the node's identities; *identity.Manager implements them.
type Certs interface {
	Get(ctx context.Context, id workloadapi.Identity) (*identity.Cert, error)
	Roots() *x509.CertPool
}

// Resolver looks an address up on demand (docs/wire-contract.md §2.3);
// *xdsclient.Client implements it.
type Resolver interface {
	Lookup(ctx context.Context, key string) (found bool, err error)
}

// DefaultLookupTimeout bounds how long a connection waits for an
// on-demand lookup before it is refused.
const DefaultLookupTimeout = 5 * time.Second

// connectRetries is how many times an outbound connection's CONNECT is
// tried again, each on another HBONE connection, when it fails before
// the peer answered (a GOAWAY, a connection reset). Each try is bounded
// by the dial and CONNECT timeouts.
const connectRetries = 2

// Proxy carries the traffic of the node's pods.
type Proxy struct {
	Table     Table
	Certs     Certs
	ClusterID string
	Log       *slog.Logger
	// OnDemand, when set, is asked for destinations the table does not
	// hold (the table then holds only what was looked up), for at most
	// LookupTimeout (DefaultLookupTimeout when zero).
	OnDemand      Resolver
	LookupTimeout time.Duration
	// Limits bound connections; zero fields take DefaultLimits. Set
	// before the first ServePod.
	Limits Limits
	// conns counts accepted connections node-wide.
	conns counter
	// handshakes are the inbound HBONE connections whose peer is not
	// authenticated yet.
	handshakes handshakes
	// live are the open inbound connections, re-authorized by Run.
	live    liveSet
	pool    *pool
	metrics *metrics

	// open are the accepted connections whose handlers run, which Drain
	// waits for.
	open openSet

	mu      sync.Mutex
	inbound map[*hbone.ServerConn]struct{}
	// pods are those ServePod serves, until their listeners close.
	pods map[*servedPod]struct{}
	// draining: Drain has begun; nothing new is served.
	draining bool
}

// New returns a Proxy; its metrics go to reg.
func New(table Table, certs Certs, clusterID string, reg prometheus.Registerer, log *slog.Logger) (*Proxy, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Table: table, Certs: certs, ClusterID: clusterID, Log: log.With("component", "proxy"), pool: newPool(), metrics: m,
		inbound: map[*hbone.ServerConn]struct{}{}, pods: map[*servedPod]struct{}{}}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "canopy_node_connections_open",
		Help: "Accepted connections held open now, node-wide (bounded by --max-connections)."},
		func() float64 { return float64(p.conns.open()) })
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "canopy_node_handshakes_pending",
		Help: "Inbound HBONE connections whose peer is not authenticated yet (mTLS handshake under way), node-wide (bounded by --max-pending-handshakes)."},
		func() float64 { return float64(p.handshakes.pending()) })
	for _, g := range []prometheus.Collector{open, pending} {
		if err := reg.Register(g); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Close drops pooled connections.
func (p *Proxy) Close() { p.pool.close() }

// ServePod serves a pod's listeners until they close; self is the pod's
// workload. Each accepted connection takes a slot of the pod's and of the
// node's connection limits, or is closed at once; one on 15008 also takes
// a pending handshake's slot until its peer is authenticated (see
// Limits.MaxPendingHandshakes). A draining proxy serves no new pod: its
// listeners are closed at once.
func (p *Proxy) ServePod(pod *inpod.Pod, self *workloadapi.Workload) {
	sp := &servedPod{pod: pod}
	p.mu.Lock()
	if p.draining {
		p.mu.Unlock()
		_ = pod.CloseListeners()
		return
	}
	p.pods[sp] = struct{}{}
	sp.accepting.Add(3)
	p.mu.Unlock()
	go func() {
		sp.accepting.Wait()
		p.mu.Lock()
		delete(p.pods, sp)
		p.mu.Unlock()
	}()
	lim := p.limits()
	var podConns counter
	serverTLS := p.serverTLSFor(workloadapi.WorkloadIdentity(self))
	serve := func(l net.Listener, kind string, handle func(net.Conn, *handshake)) {
		defer sp.accepting.Done()
		var backoff time.Duration
		for {
			c, err := l.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				// Out of descriptors or memory: wait and go on, as a
				// listener that stopped would leave the pod unserved for
				// good once the pressure is gone.
				p.metrics.refused.WithLabelValues(reasonAcceptError).Inc()
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.Log.Warn("accept failed", "listener", l.Addr().String(), "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			backoff = 0
			if !podConns.acquire(lim.MaxConnectionsPerPod) {
				p.refuse(c, reasonPodLimit)
				continue
			}
			if !p.conns.acquire(lim.MaxConnections) {
				podConns.release()
				p.refuse(c, reasonNodeLimit)
				continue
			}
			// Before a goroutine is started for it: a flood past the
			// bound costs the proxy a close each.
			var hs *handshake
			if kind == kindHBONE {
				var evicted bool
				hs, evicted = p.handshakes.start(c, addrOf(c.RemoteAddr()), lim.MaxPendingHandshakes, lim.MaxPendingHandshakesPerSource)
				if evicted {
					p.metrics.refused.WithLabelValues(reasonNodeHandshakeLimit).Inc()
				}
				if hs == nil {
					p.conns.release()
					podConns.release()
					p.refuse(c, reasonSourceHandshakeLimit)
					continue
				}
			}
			// Registered before the next Accept: once the loop is over,
			// Drain finds every connection it returned.
			p.open.add(c, kind)
			go func() {
				defer podConns.release()
				defer p.conns.release()
				defer p.open.remove(c)
				defer hs.done()
				handle(c, hs)
			}()
		}
	}
	go serve(pod.Outbound, kindOutbound, func(c net.Conn, _ *handshake) { p.outbound(c, pod, self) })
	go serve(pod.Inbound, kindInbound, func(c net.Conn, _ *handshake) { p.inboundPlain(c, pod, self) })
	go serve(pod.HBONE, kindHBONE, func(c net.Conn, hs *handshake) { p.inboundHBONE(c, hs, serverTLS, pod, self) })
}

func (p *Proxy) limits() Limits { return p.Limits.withDefaults() }

// countTimeout counts err if a limit's deadline caused it.
func (p *Proxy) countTimeout(err error) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		p.metrics.refused.WithLabelValues(reasonTimeout).Inc()
	}
}

// refuse closes a connection over a limit, counted by reason; the log is
// at debug level, as a flood would otherwise flood it too.
func (p *Proxy) refuse(c net.Conn, reason string) {
	p.metrics.refused.WithLabelValues(reason).Inc()
	p.Log.Debug("connection refused", "reason", reason, "src", c.RemoteAddr().String(), "dst", c.LocalAddr().String())
	c.Close()
}

// outbound sends one captured connection where routing says
// (wire contract §5.5).
func (p *Proxy) outbound(c net.Conn, pod *inpod.Pod, src *workloadapi.Workload) {
	defer c.Close()
	src = p.current(src)
	dst, err := origdst.Destination(c, ownListener(pod))
	if errors.Is(err, origdst.ErrOwnListener) {
		p.refuseSelfCall(c.RemoteAddr(), c.LocalAddr().String(), err)
		return
	}
	if err != nil {
		p.Log.Warn("outbound without an original destination", "err", err)
		return
	}
	ctx := context.Background()
	if err := p.resolve(ctx, src, dst.Addr()); err != nil {
		// Fail closed: an address not known yet may be a mesh pod that
		// only accepts mTLS, or a PERMISSIVE one that would take plaintext.
		p.metrics.refused.WithLabelValues(reasonLookupFailed).Inc()
		p.Log.Warn("destination unknown: connection refused", "src", c.RemoteAddr().String(), "dst", dst.String(), "err", err)
		return
	}
	r, err := route.Decide(p.Table, src, dst, mathrand.IntN)
	if errors.Is(err, route.ErrSelfCall) {
		p.refuseSelfCall(c.RemoteAddr(), dst.String(), err)
		return
	}
	if err != nil {
		p.Log.Info("no route", "to", dst.String(), "err", err)
		return
	}
	srcID := workloadapi.WorkloadIdentity(src)
	lim := p.limits()
	if r.Kind == route.TCP {
		dctx, cancel := context.WithTimeout(ctx, lim.DialTimeout)
		up, err := pod.Dial(dctx, "tcp", r.Addr.String())
		cancel()
		if err != nil {
			p.countTimeout(err)
			return
		}
		done := p.metrics.open(connection{reporter: "source", src: src, dst: r.Workload, srcID: principal(srcID), securityPolicy: "unknown"})
		sent, received := relay(c, up)
		done(sent, received, false)
		return
	}
	cert, err := p.Certs.Get(ctx, srcID)
	if err != nil {
		p.Log.Warn("no certificate for the source", "identity", srcID.String(), "err", err)
		return
	}
	dstID := r.Identities[0]
	addr := r.Addr.String()
	key := poolKey{src: srcID, dst: dstID, addr: addr}
	dial := func(ctx context.Context) (net.Conn, error) {
		raw, err := pod.Dial(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return hbone.ClientTLS(ctx, raw, clientTLS(cert.TLS(), p.Certs.Roots(), r.Identities))
	}
	headers := p.headers(src, c.RemoteAddr())
	var s *hbone.Stream
	for attempt := 0; ; attempt++ {
		dctx, cancel := context.WithTimeout(ctx, lim.DialTimeout)
		cc, err := p.pool.get(dctx, key, lim.HBONE, dial)
		cancel()
		if err != nil {
			p.countTimeout(err)
			p.Log.Warn("HBONE connection failed", "to", addr, "err", err)
			return
		}
		cctx, cancel := context.WithTimeout(ctx, lim.ConnectTimeout)
		s, err = cc.Connect(cctx, r.Authority, headers)
		cancel()
		if err == nil {
			break
		}
		p.countTimeout(err)
		// A connection the peer is closing (a drain, a restart) fails
		// before the stream exists: try another. The failed one takes
		// no new stream but keeps carrying the streams it has: a
		// draining peer lets them finish. More than one retry: during a
		// hand-over a fresh connection may still reach the old proxy's
		// listener just before it closes, and be sent GOAWAY in turn.
		// An answer from the peer (a status) is final.
		var status *hbone.StatusError
		if attempt < connectRetries && !errors.As(err, &status) {
			cc.CloseWhenIdle()
			continue
		}
		p.Log.Info("CONNECT refused", "to", dst.String(), "err", err)
		return
	}
	done := p.metrics.open(connection{reporter: "source", src: src, dst: r.Workload, srcID: principal(srcID), dstID: principal(dstID), securityPolicy: "mutual_tls"})
	sent, received, _ := hbone.Splice(c, s)
	done(sent, received, false)
}

// resolve makes sure the table knows ip before src's connection is
// routed: in on-demand mode an address it does not hold (for src's
// namespace) is looked up, and the connection waits for the answer. Not
// found is an answer (the address is outside the mesh); no answer in time
// is an error.
func (p *Proxy) resolve(ctx context.Context, src *workloadapi.Workload, ip netip.Addr) error {
	if p.OnDemand == nil {
		return nil
	}
	network := src.GetNetwork()
	if w, svc := p.Table.ByAddressFrom(src.GetNamespace(), network, ip); w != nil || svc != nil {
		return nil
	}
	timeout := p.LookupTimeout
	if timeout <= 0 {
		timeout = DefaultLookupTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := p.OnDemand.Lookup(ctx, workloadapi.IPKey(network, ip)); err != nil {
		return fmt.Errorf("on-demand lookup of %s: %w", ip, err)
	}
	return nil
}

// ownListener reports whether a connection's local address is one of the
// proxy's own listeners in pod: an in-pod port on loopback or on an
// address of the pod. Only a connection that came unNATed is asked about
// (origdst.Destination), and only on those ports, so the namespace is
// seldom entered; the pod's own addresses are asked of its namespace, as
// its workload may not hold them yet (a pod is served from before it has
// an address). An address that cannot be told is taken as the pod's:
// refusing a connection beats looping on it.
func ownListener(pod *inpod.Pod) func(netip.AddrPort) bool {
	return func(a netip.AddrPort) bool {
		if !inpod.IsPort(a.Port()) {
			return false
		}
		owns, err := pod.Owns(a.Addr())
		return owns || err != nil
	}
}

// hasAddr reports whether ip is one of w's addresses (a dual-stack pod
// has two).
func hasAddr(w *workloadapi.Workload, ip netip.Addr) bool {
	for _, b := range w.GetAddresses() {
		if a, ok := netip.AddrFromSlice(b); ok && a.Unmap() == ip.Unmap() {
			return true
		}
	}
	return false
}

// headers are the request headers of wire contract §5.3.
func (p *Proxy) headers(src *workloadapi.Workload, from net.Addr) [][2]string {
	var baggage []string
	add := func(k, v string) {
		if v != "" {
			baggage = append(baggage, k+"="+v)
		}
	}
	add("k8s.cluster.name", p.ClusterID)
	add("k8s.namespace.name", src.GetNamespace())
	add("k8s."+strings.ToLower(src.GetWorkloadType().String())+".name", src.GetWorkloadName())
	add("service.name", src.GetCanonicalName())
	add("service.version", src.GetCanonicalRevision())
	trace := make([]byte, 24)
	_, _ = rand.Read(trace)
	return [][2]string{
		{"baggage", strings.Join(baggage, ",")},
		{"forwarded", `for="` + from.String() + `"`},
		{"traceparent", "00-" + hex.EncodeToString(trace[:16]) + "-" + hex.EncodeToString(trace[16:]) + "-00"},
	}
}

// serverTLSFor is the TLS configuration of 15008 in a pod whose identity
// is self. The pod's certificate is fetched, and the roots read, once a
// client's ClientHello has arrived: a connection whose peer says nothing
// holds neither (nor any TLS state: hbone.ServerTLS waits for the first
// byte without it). The wait for the certificate has the handshake's
// deadline: a peer gets no more time because the CA is slow.
func (p *Proxy) serverTLSFor(self workloadapi.Identity) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cert, err := p.Certs.Get(hello.Context(), self)
			if err != nil {
				return nil, fmt.Errorf("certificate of %s: %w", self, err)
			}
			return serverTLS(cert.TLS(), p.Certs.Roots(), self.TrustDomain), nil
		}}
}

// inboundHBONE terminates mTLS and serves the CONNECTs of one connection;
// hs is its pending handshake, done once the peer is authenticated.
func (p *Proxy) inboundHBONE(raw net.Conn, hs *handshake, cfg *tls.Config, pod *inpod.Pod, self *workloadapi.Workload) {
	ctx := context.Background()
	selfID := workloadapi.WorkloadIdentity(self)
	hctx, cancel := context.WithTimeout(ctx, p.limits().HandshakeTimeout)
	tc, err := hbone.ServerTLS(hctx, raw, cfg)
	cancel() // the connection outlives the handshake's deadline
	hs.done()
	if err != nil {
		if hs.evicted.Load() {
			return // counted as node_handshake_limit
		}
		p.countTimeout(err)
		p.Log.Info("inbound TLS handshake failed", "from", raw.RemoteAddr().String(), "err", err)
		return
	}
	state := tc.(interface{ ConnectionState() tls.ConnectionState }).ConnectionState()
	// The handshake verified the chain (serverTLS); only read the ID.
	peer, err := leafIdentity(state.PeerCertificates[0])
	if err != nil {
		tc.Close()
		return
	}
	srcIP := addrOf(raw.RemoteAddr())
	srcW, _ := p.Table.ByAddress(self.GetNetwork(), srcIP)
	sc, done := hbone.ServeWith(tc, p.limits().HBONE, func(s *hbone.Stream) {
		// Per stream: a pooled connection outlives changes to the pod's
		// workload (its policies, a provisional one replaced).
		cur := p.current(self)
		code, up, conn := p.admit(ctx, s.Request.Authority, pod, cur, authz.Conn{Src: srcIP, Peer: &peer})
		if code != 200 {
			_ = s.Respond(code, nil)
			return
		}
		if err := s.Respond(200, nil); err != nil {
			up.Close()
			return
		}
		l := &live{self: self, conn: conn, authority: s.Request.Authority, close: func() { s.Close(); up.Close() }}
		done := p.metrics.open(connection{reporter: "destination", src: srcW, dst: cur, srcID: principal(peer), dstID: principal(selfID), securityPolicy: "mutual_tls"})
		untrack := p.track(l)
		toApp, fromApp, _ := hbone.Splice(up, s)
		untrack()
		done(fromApp, toApp, l.revoked.Load())
	})
	p.mu.Lock()
	p.inbound[sc] = struct{}{}
	draining := p.draining
	p.mu.Unlock()
	if draining {
		// Accepted just before the listeners closed, its handshake ended
		// after Drain sent its GOAWAYs: the peer's streams go elsewhere.
		sc.GoAway()
	}
	// Held until the connection ends, so that it keeps its slot of the
	// connection limits for as long as it is open, not only while it
	// shakes hands.
	<-done
	p.mu.Lock()
	delete(p.inbound, sc)
	p.mu.Unlock()
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// admit validates the authority (wire contract §5.3: it must be this pod),
// applies the policies and dials the app; it returns the status to answer.
// The connection as authorized (with its destination) is returned for
// re-authorization while it stays open.
func (p *Proxy) admit(ctx context.Context, authority string, pod *inpod.Pod, self *workloadapi.Workload, c authz.Conn) (int, net.Conn, authz.Conn) {
	dst, err := parseAuthority(authority)
	if err != nil || !hasAddr(self, dst.Addr()) {
		return 400, nil, c
	}
	if err := route.CheckInbound(dst); err != nil {
		p.refuseSelfCall(net.TCPAddrFromAddrPort(netip.AddrPortFrom(c.Src, 0)), authority, err)
		return 400, nil, c
	}
	c.Dst, c.DstPort = dst.Addr(), dst.Port()
	d := authz.Evaluate(authz.Applicable(p.Table.Policies(), self), c)
	if !d.Allow {
		p.deny(self, c, authority, d)
		return 401, nil, c
	}
	// The app sees the client's address where the kernel allows it
	// (wire contract §5.3, best effort), else the pod's own.
	ctx, cancel := context.WithTimeout(ctx, p.limits().DialTimeout)
	defer cancel()
	up, err := pod.DialFrom(ctx, c.Src, "tcp", authority)
	if err != nil {
		if up, err = pod.Dial(ctx, "tcp", authority); err != nil {
			return 503, nil, c
		}
	}
	return 200, up, c
}

// deny logs and counts a connection the policies refused, with who asked
// (address, workload, identity) and for what.
func (p *Proxy) deny(self *workloadapi.Workload, c authz.Conn, authority string, d authz.Decision) {
	srcW, _ := p.Table.ByAddress(self.GetNetwork(), c.Src)
	conn := connection{reporter: "destination", src: srcW, dst: self,
		dstID: principal(workloadapi.WorkloadIdentity(self)), securityPolicy: "none"}
	if c.Peer != nil {
		conn.srcID, conn.securityPolicy = principal(*c.Peer), "mutual_tls"
	}
	p.metrics.denied(conn)
	p.Log.Info("connection denied",
		"src", c.Src.String(), "src_workload", podName(srcW), "src_identity", conn.srcID,
		"dst", authority, "dst_workload", podName(self),
		"policy", d.Policy, "reason", d.Reason)
}

// refuseSelfCall logs and counts a connection whose destination is the
// proxy itself.
func (p *Proxy) refuseSelfCall(from net.Addr, to string, err error) {
	p.metrics.refused.WithLabelValues(reasonSelfCall).Inc()
	p.Log.Info("connection to the proxy itself refused", "src", from.String(), "dst", to, "err", err)
}

// podName is "<namespace>/<name>" of a workload, or "unknown".
func podName(w *workloadapi.Workload) string {
	if w == nil {
		return "unknown"
	}
	return w.GetNamespace() + "/" + w.GetName()
}

// parseAuthority reads a CONNECT authority, "<ip>:<port>"
// (wire contract §5.3); a hostname authority (east-west gateways) is not
// served here.
func parseAuthority(s string) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("authority %q has a zone", s)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return netip.AddrPort{}, fmt.Errorf("authority %q: bad port", s)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
}

// inboundPlain authorizes a plaintext connection (no identity) and
// carries it to the app.
func (p *Proxy) inboundPlain(c net.Conn, pod *inpod.Pod, self *workloadapi.Workload) {
	self = p.current(self)
	dst, err := origdst.Destination(c, ownListener(pod))
	if err != nil {
		if errors.Is(err, origdst.ErrOwnListener) {
			p.refuseSelfCall(c.RemoteAddr(), c.LocalAddr().String(), err)
		}
		c.Close()
		return
	}
	src := addrOf(c.RemoteAddr())
	code, up, conn := p.admit(context.Background(), dst.String(), pod, self, authz.Conn{Src: src})
	if code != 200 {
		c.Close()
		return
	}
	srcW, _ := p.Table.ByAddress(self.GetNetwork(), src)
	l := &live{self: self, conn: conn, authority: dst.String(), close: func() { c.Close(); up.Close() }}
	done := p.metrics.open(connection{reporter: "destination", src: srcW, dst: self, dstID: principal(workloadapi.WorkloadIdentity(self)), securityPolicy: "none"})
	untrack := p.track(l)
	sent, received := relay(c, up)
	untrack()
	done(sent, received, l.revoked.Load())
}

// relay copies both ways between two TCP connections and reports the
// bytes each way (sent: a to b).
func relay(a, b net.Conn) (sent, received int64) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn, n *int64) {
		buf := make([]byte, 64<<10)
		*n, _ = io.CopyBuffer(dst, src, buf)
		if hc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(b, a, &sent)
	go cp(a, b, &received)
	<-done
	<-done
	a.Close()
	b.Close()
	return sent, received
}
