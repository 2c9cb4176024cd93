package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/node/dns/authority"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Table is the workload table the answers come from;
// *workloadtable.Table implements it.
type Table interface {
	authority.Services
	// Workload is a workload by UID: a pod's current one, whose network
	// may have changed since it was served.
	Workload(uid string) *workloadapi.Workload
}

// Forwarder relays a query to a pod's resolvers over network ("udp" or
// "tcp") and returns their answer as it came, with the query's ID.
type Forwarder interface {
	Forward(ctx context.Context, req *mdns.Msg, network string) (*mdns.Msg, error)
}

// Upstream is a pod's way to its resolvers.
type Upstream struct {
	Forwarder Forwarder
	// Nameservers and From (where they were read) are for views.
	Nameservers []string
	From        string
	// Final is false for a stand-in (resolvers that are not the pod's
	// own, which could not be read yet): Upstreams is asked again after
	// retryUpstreams.
	Final bool
}

// Upstreams makes a pod's Upstream: its resolvers, reached from inside
// its namespace. It is asked when the pod's first query to forward
// arrives, again after it failed, and again later when its answer was
// not final.
type Upstreams func(pod *inpod.Pod) (Upstream, error)

// retryUpstreams is how long a Forwarder that Upstreams did not call
// final is used before Upstreams is asked again.
const retryUpstreams = 30 * time.Second

// Limits bound what one pod may hold of the server.
type Limits struct {
	// MaxInFlight is how many of a pod's forwarded queries may wait for
	// its resolvers at once.
	MaxInFlight int
	// MaxTCPConns is how many TCP connections a pod may hold open.
	MaxTCPConns int
	// MaxTCPQueries is how many queries one TCP connection may send.
	MaxTCPQueries int
	// TCPIdleTimeout closes a TCP connection without a query for that
	// long; ReadTimeout and WriteTimeout bound reading one query and
	// writing one answer.
	TCPIdleTimeout, ReadTimeout, WriteTimeout time.Duration
	// ForwardTimeout bounds a forwarded query, every resolver tried.
	ForwardTimeout time.Duration
}

// DefaultLimits are the limits unless told.
func DefaultLimits() Limits {
	return Limits{
		// Far more than a pod's resolver has outstanding: glibc asks A
		// and AAAA at once, a busy app a few names at a time.
		MaxInFlight:    128,
		MaxTCPConns:    32,
		MaxTCPQueries:  128,
		TCPIdleTimeout: 5 * time.Second,
		ReadTimeout:    2 * time.Second,
		WriteTimeout:   2 * time.Second,
		// A resolver's own timeout (5 s in glibc) is the most a client
		// waits for one try.
		ForwardTimeout: 5 * time.Second,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = d.MaxInFlight
	}
	if l.MaxTCPConns <= 0 {
		l.MaxTCPConns = d.MaxTCPConns
	}
	if l.MaxTCPQueries <= 0 {
		l.MaxTCPQueries = d.MaxTCPQueries
	}
	if l.TCPIdleTimeout <= 0 {
		l.TCPIdleTimeout = d.TCPIdleTimeout
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = d.ReadTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	if l.ForwardTimeout <= 0 {
		l.ForwardTimeout = d.ForwardTimeout
	}
	return l
}

// Config configures a Server.
type Config struct {
	Table     Table
	Upstreams Upstreams
	// ClusterDomain is the Kubernetes cluster domain (default
	// cluster.local).
	ClusterDomain string
	Limits        Limits
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Server serves DNS in every pod it is given; it implements
// pods.Server. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	lim     Limits
	log     *slog.Logger
	metrics *metrics

	mu sync.Mutex
	// pods are the pods served, by "<namespace>/<name>", for views.
	pods map[string]*podServer
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Table == nil || cfg.Upstreams == nil {
		return nil, errors.New("dns: a table and upstreams are required")
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = authority.DefaultClusterDomain
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, lim: cfg.Limits.withDefaults(), log: log.With("component", "dns"), metrics: m}, nil
}

// ServePod implements pods.Server: it answers on the pod's DNS sockets
// until they close (inpod.Pod.CloseListeners). A pod opened without
// them is not served.
func (s *Server) ServePod(pod *inpod.Pod, self *workloadapi.Workload) {
	if len(pod.DNSUDP) == 0 && len(pod.DNSTCP) == 0 {
		return
	}
	p := &podServer{s: s, pod: pod, self: self, inFlight: make(chan struct{}, s.lim.MaxInFlight)}
	key := self.GetNamespace() + "/" + self.GetName()
	if pod.SocketMap {
		p.replies = &replySockets{open: pod.ListenTransparentUDP, log: s.log.With("pod", key)}
	}
	s.mu.Lock()
	if s.pods == nil {
		s.pods = map[string]*podServer{}
	}
	s.pods[key] = p
	s.mu.Unlock()
	p.serving.Add(len(pod.DNSUDP) + len(pod.DNSTCP))
	go func() {
		p.serving.Wait()
		if p.replies != nil {
			p.replies.close()
		}
		s.mu.Lock()
		if s.pods[key] == p {
			delete(s.pods, key)
		}
		s.mu.Unlock()
	}()
	for _, pc := range pod.DNSUDP {
		if uc, ok := pc.(*net.UDPConn); ok && p.replies != nil {
			// Queries come unNATed: each is answered from where it was
			// sent (steeredConn).
			pc = newSteeredConn(uc, p.replies)
		}
		srv := &mdns.Server{PacketConn: pc, Handler: p.handler("udp"), UDPSize: maxUDPQuery}
		go p.run(srv, pc.LocalAddr())
	}
	tcpConns := make(chan struct{}, s.lim.MaxTCPConns)
	for _, l := range pod.DNSTCP {
		srv := &mdns.Server{
			Listener:      &limitListener{Listener: l, slots: tcpConns, full: func() { s.metrics.dropped.WithLabelValues(reasonTCPLimit).Inc() }},
			Handler:       p.handler("tcp"),
			ReadTimeout:   s.lim.ReadTimeout,
			WriteTimeout:  s.lim.WriteTimeout,
			IdleTimeout:   func() time.Duration { return s.lim.TCPIdleTimeout },
			MaxTCPQueries: s.lim.MaxTCPQueries,
		}
		go p.run(srv, l.Addr())
	}
}

// maxUDPQuery is the read buffer of a UDP query: far above any real query
// (a question and an EDNS record with a cookie are under 300 bytes); a
// longer one arrives cut and does not parse. The server keeps one
// buffer per socket and one per query being handled: at the 64 KiB a
// datagram could be, a pod's two sockets alone held 128 KiB
// (bench/dns, BenchmarkMemoryPerPod).
const maxUDPQuery = 4096

// podServer is one pod's DNS.
type podServer struct {
	s    *Server
	pod  *inpod.Pod
	self *workloadapi.Workload
	// inFlight holds a slot per query being handled.
	inFlight chan struct{}
	// serving counts the sockets still served.
	serving sync.WaitGroup
	// replies answer the queries of a pod redirected by eBPF; nil for
	// one redirected by netfilter.
	replies *replySockets

	mu sync.Mutex
	up Upstream
	// upUntil, when set, is when up is to be made again.
	upUntil time.Time
}

// run serves one socket until it closes.
func (p *podServer) run(srv *mdns.Server, addr net.Addr) {
	defer p.serving.Done()
	err := srv.ActivateAndServe()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		p.s.log.Warn("DNS socket stopped", "pod", p.self.GetNamespace()+"/"+p.self.GetName(), "addr", addr.String(), "err", err)
	}
}

// current is the pod's workload as the table has it now, else as it
// was served.
func (p *podServer) current() *workloadapi.Workload {
	if w := p.s.cfg.Table.Workload(p.self.GetUid()); w != nil {
		return w
	}
	return p.self
}

// forwarder is the pod's Forwarder, made on first use.
func (p *podServer) forwarder() (Forwarder, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up.Forwarder != nil && (p.upUntil.IsZero() || time.Now().Before(p.upUntil)) {
		return p.up.Forwarder, nil
	}
	up, err := p.s.cfg.Upstreams(p.pod)
	if err != nil {
		return nil, fmt.Errorf("pod's resolvers: %w", err)
	}
	if up.Forwarder == nil {
		return nil, errors.New("pod's resolvers: no forwarder")
	}
	p.up, p.upUntil = up, time.Time{}
	if !up.Final {
		p.upUntil = time.Now().Add(retryUpstreams)
	}
	return up.Forwarder, nil
}

// limitListener accepts at most cap(slots) connections at once: past it a
// connection is closed as soon as accepted.
type limitListener struct {
	net.Listener
	slots chan struct{}
	full  func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.full()
			c.Close()
		}
	}
}

// slotConn gives its slot back once, when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
