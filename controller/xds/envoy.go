package xds

import (
	"context"
	"errors"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"

	"github.com/canopy-mesh/canopy/controller/sidecar"
)

// MeshSource is what Envoy resources are generated from;
// *index.Index implements it.
type MeshSource interface {
	SidecarInputs() sidecar.Inputs
}

// envoyTypes are the Envoy types served to proxyless gRPC clients, in
// push order (sidecar wire contract §1.3).
var envoyTypes = []string{sidecar.ClusterType, sidecar.EndpointType, sidecar.ListenerType, sidecar.RouteType}

func isEnvoyType(t string) bool { return slices.Contains(envoyTypes, t) }

// warms maps a type to the type whose watch must answer a same-nonce
// request after the first type's new watch: a client re-requests the
// endpoints (routes) of clusters (listeners) it is warming, and would
// wait forever for an answer it already has.
var warms = map[string]string{sidecar.ClusterType: sidecar.EndpointType, sidecar.ListenerType: sidecar.RouteType}

// meshCache builds the generators' Mesh once per generation and shares
// it, and what it generates, between connections: clients that see the
// mesh alike (same namespace and labels; for a server listener, also the
// same addresses) get the same *Resource, generated and marshalled once
// per generation.
type meshCache struct {
	src MeshSource
	mu  sync.Mutex
	cur *generation
}

// maxCachedPerGeneration bounds what one generation keeps: past it,
// resources are generated for each client again rather than held.
const maxCachedPerGeneration = 1 << 20

// generation is one Mesh and the resources generated from it.
type generation struct {
	gen  uint64
	mesh *sidecar.Mesh

	mu      sync.Mutex
	entries map[string]*cached
}

// cached is one name's resources for one class of client.
type cached struct {
	once sync.Once
	res  []*Resource
	err  error
}

func (c *meshCache) get(gen uint64) *generation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.gen != gen {
		c.cur = &generation{gen: gen, mesh: sidecar.NewMesh(c.src.SidecarInputs()), entries: map[string]*cached{}}
	}
	return c.cur
}

// entry returns the cache entry of key, or a fresh one when the
// generation holds too many.
func (g *generation) entry(key string) *cached {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[key]
	if e == nil {
		e = &cached{}
		if len(g.entries) < maxCachedPerGeneration {
			g.entries[key] = e
		}
	}
	return e
}

// classKey is what a name's resources depend on besides the mesh: the
// client's namespace and labels, and for a server listener its
// addresses.
func classKey(p Proxy, typ, name string) string {
	var b strings.Builder
	b.WriteString(typ)
	b.WriteByte(0)
	b.WriteString(p.Namespace)
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(p.Labels[k])
	}
	if typ == sidecar.ListenerType && strings.HasPrefix(name, sidecar.ServerListenerPrefix) {
		for _, ip := range sidecarProxy(p).IPs {
			b.WriteByte(0)
			b.WriteString(ip.String())
		}
	}
	b.WriteByte(0)
	b.WriteString(name)
	return b.String()
}

// envoyWatch is one type's state-of-the-world subscription.
type envoyWatch struct {
	names []string
	// sent is what was last sent, by name.
	sent          map[string]*Resource
	nonce         string
	alwaysRespond bool
}

// envoyConn is one proxyless client's stream. Its goroutine alone
// changes it; mu lets proxy status and config dumps read it.
type envoyConn struct {
	id          string
	proxy       Proxy
	peer        string
	connectedAt time.Time
	wake        chan struct{}

	mu      sync.Mutex
	watches map[string]*envoyWatch
	states  map[string]*typeState
	nonce   uint64
}

func (c *envoyConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// serveEnvoy serves a proxyless gRPC client's state-of-the-world stream
// from its first request on. Requests follow istiod's rules: a NACK is
// recorded and not answered, a request with another nonce than the last
// response's is stale and ignored, an ACK is answered only when it
// changes the names (or by the warming rule), and a change of the mesh
// sends each type whose resources changed.
func (s *Server) serveEnvoy(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], proxy Proxy, first *discoveryv3.DiscoveryRequest) error {
	c := &envoyConn{
		id:    proxy.ProxyID + "-" + strconv.FormatUint(s.connSeq.Add(1), 10),
		proxy: proxy, connectedAt: s.cfg.Now(), wake: make(chan struct{}, 1),
		watches: map[string]*envoyWatch{}, states: map[string]*typeState{},
	}
	if p, ok := peer.FromContext(stream.Context()); ok {
		c.peer = p.Addr.String()
	}
	s.envoyMu.Lock()
	s.envoyConns[c] = struct{}{}
	s.envoyMu.Unlock()
	defer func() {
		s.envoyMu.Lock()
		delete(s.envoyConns, c)
		s.envoyMu.Unlock()
	}()
	log := s.log.With("proxy", proxy.ProxyID)
	log.Info("proxyless gRPC client connected")
	defer log.Info("proxyless gRPC client disconnected")

	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	reqs := make(chan *discoveryv3.DiscoveryRequest)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				cancel(nil)
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	send := func(resps []*discoveryv3.DiscoveryResponse) error {
		for _, resp := range resps {
			if err := s.envoySend(ctx, c, stream, resp, cancel); err != nil {
				return err
			}
		}
		return nil
	}
	req := first
	for {
		if req != nil {
			resp, err := s.envoyRequest(c, req)
			if err != nil {
				return err
			}
			if resp != nil {
				if err := send([]*discoveryv3.DiscoveryResponse{resp}); err != nil {
					return err
				}
			}
			req = nil
		}
		select {
		case <-ctx.Done():
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		case req = <-reqs:
		case <-c.wake:
			resps, err := s.envoyPush(c)
			if err != nil {
				return err
			}
			if err := send(resps); err != nil {
				return err
			}
		}
	}
}

// envoyPush builds a response for every type whose resources changed, in
// push order.
func (s *Server) envoyPush(c *envoyConn) ([]*discoveryv3.DiscoveryResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*discoveryv3.DiscoveryResponse
	for _, typ := range envoyTypes {
		if w := c.watches[typ]; w != nil {
			resp, err := s.envoyRespond(c, typ, w, false)
			if err != nil {
				return nil, err
			}
			if resp != nil {
				out = append(out, resp)
			}
		}
	}
	return out, nil
}

// envoyRequest applies one request (sidecar wire contract §1.3).
// It returns the response to send, if any.
func (s *Server) envoyRequest(c *envoyConn, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	typ := req.GetTypeUrl()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !isEnvoyType(typ) {
		return nil, s.streamError("type", codes.InvalidArgument, "unsupported type URL %q for a proxyless gRPC client", typ)
	}
	if len(req.GetResourceNames()) > s.cfg.MaxSubscriptions {
		return nil, s.streamError("limit", codes.ResourceExhausted, "%s: %d names, limit %d", shortType(typ), len(req.GetResourceNames()), s.cfg.MaxSubscriptions)
	}
	st := c.states[typ]
	if st == nil {
		st = &typeState{}
		c.states[typ] = st
	}
	w := c.watches[typ]
	nonce := req.GetResponseNonce()
	if req.GetErrorDetail() != nil {
		s.metrics.nacks.WithLabelValues(shortType(typ)).Inc()
		if st.nackNonce != nonce {
			s.log.Warn("proxy rejected a response", "proxy", c.proxy.ProxyID, "type", shortType(typ), "nonce", nonce, "error", req.GetErrorDetail().GetMessage())
		}
		st.nack, st.nackNonce, st.nackAt = req.GetErrorDetail().GetMessage(), nonce, s.cfg.Now()
		return nil, nil
	}
	names := slices.Compact(slices.Sorted(slices.Values(req.GetResourceNames())))
	if len(names) == 0 {
		// Nothing wanted any more: the type is unsubscribed.
		delete(c.watches, typ)
		return nil, nil
	}
	if nonce == "" || w == nil {
		// A new watch (or a reconnecting client's first request).
		w = &envoyWatch{names: names}
		c.watches[typ] = w
		if other := c.watches[warms[typ]]; other != nil {
			other.alwaysRespond = true
		}
		return s.envoyRespond(c, typ, w, true)
	}
	if nonce != w.nonce {
		return nil, nil // stale: an answer to a response since replaced
	}
	st.nonceAcked, st.ackedAt = nonce, s.cfg.Now()
	st.nack, st.nackNonce = "", ""
	if !slices.Equal(names, w.names) {
		w.names = names
		return s.envoyRespond(c, typ, w, true)
	}
	if w.alwaysRespond {
		w.alwaysRespond = false
		return s.envoyRespond(c, typ, w, true)
	}
	return nil, nil
}

// envoyRespond builds the watch's response: always when asked for, else
// only when its resources differ from what was last sent (nil then). The
// caller holds c.mu; the response is sent after it is released, so a
// slow client never holds up its proxy status.
func (s *Server) envoyRespond(c *envoyConn, typ string, w *envoyWatch, always bool) (*discoveryv3.DiscoveryResponse, error) {
	gen := s.envoyGen.Load()
	g := s.mesh.get(gen)
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: typ, VersionInfo: strconv.FormatUint(gen, 10), ControlPlane: s.controlPlane()}
	sent := make(map[string]*Resource, len(w.names))
	for _, name := range w.names {
		e := g.entry(classKey(c.proxy, typ, name))
		e.once.Do(func() { e.res, e.err = s.generate(g.mesh, c.proxy, typ, name) })
		if e.err != nil {
			return nil, e.err
		}
		for _, r := range e.res {
			if _, dup := sent[r.Name]; dup {
				continue // two names asked for the same resource
			}
			sent[r.Name] = r
			resp.Resources = append(resp.Resources, r.Body)
		}
	}
	sameVersion := func(a, b *Resource) bool { return a.Version == b.Version }
	if !always && maps.EqualFunc(sent, w.sent, sameVersion) {
		return nil, nil
	}
	c.nonce++
	resp.Nonce = strconv.FormatUint(c.nonce, 10)
	w.sent, w.nonce = sent, resp.Nonce
	st := c.states[typ]
	st.nonceSent, st.sentAt = resp.Nonce, s.cfg.Now()
	return resp, nil
}

// envoySend sends one response within the send timeout.
func (s *Server) envoySend(ctx context.Context, c *envoyConn, stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], resp *discoveryv3.DiscoveryResponse, cancel context.CancelCauseFunc) error {
	if err := sendWithin(ctx, s, c.id, cancel, stream.Send, resp); err != nil {
		return err
	}
	short := shortType(resp.GetTypeUrl())
	s.metrics.pushes.WithLabelValues(short).Inc()
	s.metrics.resourcesSent.WithLabelValues(short).Add(float64(len(resp.GetResources())))
	return nil
}

// generate runs the generators for one name of one proxy and marshals
// what they return. A panic there is a bug that input reached: it ends
// this stream with Internal and is logged, and the controller keeps
// serving everyone else.
func (s *Server) generate(mesh *sidecar.Mesh, p Proxy, typ, name string) (out []*Resource, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("generating Envoy resources failed", "proxy", p.ProxyID, "type", shortType(typ), "name", name, "panic", r, "stack", string(debug.Stack()))
			out, err = nil, s.streamError("internal", codes.Internal, "generating %s %q failed", shortType(typ), name)
		}
	}()
	for _, n := range mesh.Generate(sidecarProxy(p), typ, []string{name}) {
		r, err := NewResource(typ, n.Name, n.Resource)
		if err != nil {
			return nil, s.streamError("internal", codes.Internal, "%v", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// sidecarProxy is the generators' view of a proxy.
func sidecarProxy(p Proxy) sidecar.Proxy {
	ips := p.InstanceIPs
	if len(ips) == 0 && p.IP.IsValid() {
		ips = append(ips, p.IP)
	}
	return sidecar.Proxy{Namespace: p.Namespace, Labels: p.Labels, IPs: ips}
}

// envoyChanged moves Envoy clients to a new generation of the mesh.
func (s *Server) envoyChanged() {
	if s.mesh == nil {
		return
	}
	s.envoyGen.Add(1)
	s.envoyMu.Lock()
	defer s.envoyMu.Unlock()
	for c := range s.envoyConns {
		c.signal()
	}
}

// status is the connection's proxy status.
func (c *envoyConn) status() ProxyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := newProxyStatus(c.proxy, c.id, c.peer, c.connectedAt)
	for _, typ := range envoyTypes {
		w, st := c.watches[typ], c.states[typ]
		if w == nil || st == nil {
			continue
		}
		ts := st.typeStatus(typ)
		ts.Subscribed, ts.Resources = len(w.names), len(w.sent)
		ps.Types = append(ps.Types, ts)
	}
	return ps
}

// dump is what the connection was last sent, by type.
func (c *envoyConn) dump() ConfigDump {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := ConfigDump{ProxyID: c.proxy.ProxyID, Connection: c.id, Types: map[string][]DumpedResource{}}
	for typ, w := range c.watches {
		d.Types[shortType(typ)] = dumpResources(w.sent)
	}
	return d
}

// envoyConnections returns the proxyless clients' connections.
func (s *Server) envoyConnections() []*envoyConn {
	s.envoyMu.Lock()
	defer s.envoyMu.Unlock()
	return slices.Collect(maps.Keys(s.envoyConns))
}
