package xds

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/sidecar"
)

// MeshSource is what Envoy resources are generated from;
// *index.Index implements it.
type MeshSource interface {
	SidecarInputs() sidecar.Inputs
}

// Generator answers Envoy types from one generation of the mesh, in
// shares that clients alike get alike; *sidecar.Mesh implements it. It is
// shared by every connection of its generation, so it must be safe for
// concurrent use.
type Generator interface {
	// GRPCShares answers a proxyless gRPC client's names.
	GRPCShares(p sidecar.Proxy, typeURL string, names []string) []sidecar.Share
	// SidecarShares answers an Envoy sidecar; names are ignored for the
	// types sidecar.IsWildcard reports.
	SidecarShares(p sidecar.Proxy, typeURL string, names []string) []sidecar.Share
	// DepsOf summarises the parts of the Mesh a share's generation read
	// (sidecar.Mesh.DepsOf).
	DepsOf(r *sidecar.Reads) string
}

// newMeshGenerator is the default Config.NewGenerator.
func newMeshGenerator(in sidecar.Inputs) Generator { return sidecar.NewMesh(in) }

// envoyTypes are the Envoy types served to sidecars and proxyless gRPC
// clients, in push order (sidecar wire contract §1.3).
var envoyTypes = []string{sidecar.ClusterType, sidecar.EndpointType, sidecar.ListenerType, sidecar.RouteType}

func isEnvoyType(t string) bool { return slices.Contains(envoyTypes, t) }

// warms maps a type to the type whose watch must answer a same-nonce
// request after the first type's new watch: a client re-requests the
// endpoints (routes) of clusters (listeners) it is warming, and would
// wait forever for an answer it already has.
var warms = map[string]string{sidecar.ClusterType: sidecar.EndpointType, sidecar.ListenerType: sidecar.RouteType}

// maxResourceNameLen bounds one requested Envoy resource name. The
// longest a client needs is a cluster name: "outbound|<port>|<subset>|"
// and a DNS name of at most 253 bytes.
const maxResourceNameLen = 1024

// meshCache builds the generators' Mesh once per generation and shares
// it, and what it generates, between connections: clients whose shares
// have the same key (sidecar.Share) get the same *Resource, generated and
// marshalled once per generation.
//
// A share the previous generation held is taken from it, not generated
// again, when what its generation read (sidecar.Reads) is the same in the
// new Mesh: a pod turning Ready regenerates one service's endpoints, not
// every sidecar's clusters. With verify (on in tests), a share taken over
// is generated again and compared, and a difference fails the stream: a
// dependency the record missed would otherwise serve stale config
// silently.
type meshCache struct {
	src    MeshSource
	build  func(sidecar.Inputs) Generator
	verify bool
	mu     sync.Mutex
	cur    *generation
}

// maxCachedPerGeneration bounds what one generation keeps: past it,
// resources are generated for each client again rather than held.
const maxCachedPerGeneration = 1 << 20

// generation is one Mesh and the resources generated from it.
type generation struct {
	gen  uint64
	mesh Generator

	mu      sync.Mutex
	entries map[cacheKey]*cached
	// prev is the previous generation, whose entries this one may take
	// over; nil once this one is the previous one.
	prev *generation
}

// cached is one share's resources, for every generation that takes it.
type cached struct {
	once sync.Once
	res  []*Resource
	err  error
	// reads are what generating it read, and deps what its Mesh's DepsOf
	// said of them; set before done.
	reads *sidecar.Reads
	deps  string
	done  atomic.Bool
}

// fill generates the entry's resources once, recording what gen reads of
// mesh.
func (e *cached) fill(mesh Generator, gen func(*sidecar.Reads) ([]*Resource, error)) {
	e.once.Do(func() {
		r := &sidecar.Reads{}
		e.res, e.err = gen(r)
		e.reads, e.deps = r, mesh.DepsOf(r)
		e.done.Store(true)
	})
}

func (c *meshCache) get(gen uint64) *generation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.gen != gen {
		next := &generation{gen: gen, mesh: c.build(c.src.SidecarInputs()), prev: c.cur}
		size := 0
		if c.cur != nil {
			c.cur.mu.Lock()
			c.cur.prev = nil // keep one generation back, not all
			size = len(c.cur.entries)
			c.cur.mu.Unlock()
		}
		// About as many shares as last time: sized once, not grown.
		next.entries = make(map[cacheKey]*cached, size)
		c.cur = next
	}
	return c.cur
}

// entry returns the cache entry of key: this generation's, else the
// previous one's when what it read is the same in this generation's Mesh
// (taken: true), else a fresh one (not kept when the generation holds too
// many).
func (g *generation) entry(key cacheKey) (e *cached, taken bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.entries[key]; e != nil {
		return e, false
	}
	if g.prev != nil {
		g.prev.mu.Lock()
		old := g.prev.entries[key]
		g.prev.mu.Unlock()
		// An entry still being generated, or that failed, is not taken.
		if old != nil && old.done.Load() && old.err == nil && g.mesh.DepsOf(old.reads) == old.deps {
			e, taken = old, true
		}
	}
	if e == nil {
		e = &cached{}
	}
	if len(g.entries) < maxCachedPerGeneration {
		g.entries[key] = e
	}
	return e, taken
}

// holds reports whether the generation itself (not its predecessor) has
// an entry for key.
func (g *generation) holds(key cacheKey) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entries[key] != nil
}

// cacheKey is a share's key in its generation's cache: the kind of
// client (sidecar and proxyless resources are never shared), the type and
// the share's own key.
type cacheKey struct {
	sidecar          bool
	typ, share, name string
}

// envoyWatch is one type's subscription on an Envoy client's stream.
type envoyWatch struct {
	// wildcard: a sidecar's clusters or listeners, everything the proxy
	// sees whatever the names.
	wildcard bool
	// names are the names asked for: over state of the world the last
	// request's, over Delta the subscribed ones. A wildcard watch keeps
	// them only to tell a change.
	names map[string]struct{}
	// sent is what the client holds, by name: what was last sent, or
	// after a Delta reconnect what it said it holds (placeholders with
	// only the version it gave).
	sent map[string]*Resource
	// answer are Delta names subscribed since the last response: one the
	// generators do not answer is sent as removed, so the client stops
	// waiting for it.
	answer map[string]struct{}
	// initial: the Delta watch's first response is still to be sent; it
	// leaves out what the client holds at the same version.
	initial       bool
	nonce         string
	alwaysRespond bool
	// charge is what names cost the stream's caller.
	charge chargedNames
}

func newEnvoyWatch(wildcard bool) *envoyWatch {
	return &envoyWatch{wildcard: wildcard, names: map[string]struct{}{}, sent: map[string]*Resource{}, answer: map[string]struct{}{}}
}

// setNames replaces the names asked for (a state-of-the-world request's).
func (w *envoyWatch) setNames(names map[string]struct{}) {
	w.names, w.charge.cost = names, 0
	for n := range names {
		w.charge.cost += nameCost(n)
	}
}

// addName adds a name asked for and reports whether it is new.
func (w *envoyWatch) addName(n string) bool {
	if _, ok := w.names[n]; ok {
		return false
	}
	w.names[n] = struct{}{}
	w.charge.cost += nameCost(n)
	return true
}

// delName removes a name asked for and reports whether it was there.
func (w *envoyWatch) delName(n string) bool {
	if _, ok := w.names[n]; !ok {
		return false
	}
	delete(w.names, n)
	w.charge.cost -= nameCost(n)
	return true
}

// envoyConn is one Envoy client's stream: an Envoy sidecar's or a
// proxyless gRPC client's, over state of the world or Delta. Its
// goroutine alone changes it; mu lets proxy status and config dumps read
// it.
type envoyConn struct {
	id    string
	proxy Proxy
	// caller is who opened the stream; its watches' names are charged to
	// it.
	caller      authn.Caller
	peer        string
	connectedAt time.Time
	wake        chan struct{}
	// sidecar: served by GenerateSidecar, with wildcard clusters and
	// listeners; else a proxyless gRPC client, served by Generate.
	sidecar bool

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

func (c *envoyConn) nextNonce() string {
	c.nonce++
	return strconv.FormatUint(c.nonce, 10)
}

// kind names the client in logs.
func (c *envoyConn) kind() string {
	if c.sidecar {
		return "sidecar"
	}
	return "proxyless"
}

// servesEnvoy reports whether a node is served Envoy types: a proxyless
// gRPC client, or an Envoy sidecar. Gateways and waypoints (router
// nodes) and ztunnel are not.
func servesEnvoy(p Proxy) (forSidecar, ok bool) {
	switch {
	case p.Generator == "grpc":
		return false, true
	case p.Type == "sidecar":
		return true, true
	}
	return false, false
}

// envoyStream reports whether a stream whose first request asks for
// typ is an Envoy client's, or the error that refuses it. A node that is
// not served Envoy types (a gateway's or waypoint's) is refused with
// Unimplemented; false and nil: not an Envoy type, the stream is served
// as a node proxy's.
func (s *Server) envoyStream(p Proxy, typ string) (bool, error) {
	if !isEnvoyType(typ) {
		return false, nil
	}
	if _, ok := servesEnvoy(p); !ok {
		return false, s.streamError("type", codes.Unimplemented,
			"type %q for a %s proxy: Envoy types are served only to sidecars and proxyless gRPC clients (node metadata GENERATOR \"grpc\"), not to gateways, waypoints or ztunnel", typ, p.Type)
	}
	if s.mesh == nil {
		return false, s.streamError("type", codes.Unimplemented, "this controller serves no Envoy types (no mesh source)")
	}
	return true, nil
}

// newEnvoyConn registers a new Envoy client's connection; the returned
// func unregisters it and returns what its names were charged.
func (s *Server) newEnvoyConn(ctx context.Context, caller authn.Caller, proxy Proxy, delta bool) (*envoyConn, func()) {
	forSidecar, _ := servesEnvoy(proxy)
	c := &envoyConn{
		id:    proxy.ProxyID + "-" + strconv.FormatUint(s.connSeq.Add(1), 10),
		proxy: proxy, caller: caller, connectedAt: s.cfg.Now(), wake: make(chan struct{}, 1),
		sidecar: forSidecar,
		watches: map[string]*envoyWatch{}, states: map[string]*typeState{},
	}
	if p, ok := peer.FromContext(ctx); ok {
		c.peer = p.Addr.String()
	}
	s.envoyMu.Lock()
	s.envoyConns[c] = struct{}{}
	s.envoyMu.Unlock()
	log := s.log.With("proxy", proxy.ProxyID, "conn", c.id, "client", c.kind(), "delta", delta)
	log.Info("Envoy client connected", "peer", c.peer)
	return c, func() {
		s.envoyMu.Lock()
		delete(s.envoyConns, c)
		s.envoyMu.Unlock()
		c.mu.Lock()
		for _, w := range c.watches {
			s.releaseNames(&w.charge, caller)
		}
		c.mu.Unlock()
		log.Info("Envoy client disconnected")
	}
}

// settleEnvoyNames charges the stream's caller for what w's names cost
// now; an error ends the stream. The caller holds c.mu.
func (s *Server) settleEnvoyNames(c *envoyConn, typ string, w *envoyWatch) error {
	return s.settleNames(&w.charge, c.caller, shortType(typ))
}

// dropEnvoyWatch ends the watch of typ, if any, and returns what its
// names were charged. The caller holds c.mu.
func (s *Server) dropEnvoyWatch(c *envoyConn, typ string) {
	if w := c.watches[typ]; w != nil {
		s.releaseNames(&w.charge, c.caller)
		delete(c.watches, typ)
	}
}

// serveEnvoyStream runs an Envoy client's stream from its first request
// on: one goroutine reads requests, this one applies them and changes of
// the mesh in turn and sends what they produce. Responses are built under
// c.mu and sent after it, so a slow client never holds up its proxy
// status; each send is bounded by the send timeout.
func serveEnvoyStream[Req, Resp any](s *Server, c *envoyConn, stream grpc.BidiStreamingServer[Req, Resp], first *Req,
	handle func(*Req) ([]*Resp, error), push func() ([]*Resp, error), count func(*Resp) (typ string, n int),
) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	reqs := make(chan *Req)
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
	send := func(resps []*Resp) error {
		for _, resp := range resps {
			if err := sendWithin(ctx, s, c.id, cancel, stream.Send, resp); err != nil {
				return err
			}
			typ, n := count(resp)
			short := shortType(typ)
			s.metrics.pushes.WithLabelValues(short).Inc()
			s.metrics.resourcesSent.WithLabelValues(short).Add(float64(n))
		}
		return nil
	}
	req := first
	for {
		if req != nil {
			resps, err := handle(req)
			if err != nil {
				return err
			}
			if err := send(resps); err != nil {
				return err
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
			resps, err := push()
			if err != nil {
				return err
			}
			if err := send(resps); err != nil {
				return err
			}
		}
	}
}

// checkNames bounds a request's names: how many (limit) and how long.
func (s *Server) checkNames(typ string, limit int, lists ...[]string) error {
	for _, names := range lists {
		if len(names) > limit {
			return s.streamError("limit", codes.ResourceExhausted, "%s: %d names, limit %d", shortType(typ), len(names), limit)
		}
		for _, n := range names {
			if len(n) > maxResourceNameLen {
				return s.streamError("name", codes.InvalidArgument, "%s: a name of %d bytes, limit %d", shortType(typ), len(n), maxResourceNameLen)
			}
		}
	}
	return nil
}

// envoySet is what a watch covers in one generation of the mesh.
type envoySet struct {
	gen uint64
	// list is what the mesh has for the watch, in order, and byName the
	// same by name: shared, cached for the generation.
	list   []*Resource
	byName map[string]*Resource
	// absent are the watch's shares of names the mesh has nothing under
	// (sidecar.Share.Absent), answered with what placeholders builds for
	// the response that carries it, never cached or held: a client may
	// name any number of them.
	absent []sidecar.Share
}

// envoyGenerate returns what the watch covers now. The caller holds c.mu.
func (s *Server) envoyGenerate(c *envoyConn, typ string, w *envoyWatch) (envoySet, error) {
	gen := s.envoyGen.Load()
	g := s.mesh.get(gen)
	var names []string
	if !w.wildcard {
		names = slices.Sorted(maps.Keys(w.names))
	}
	shares, err := s.shares(g.mesh, c, typ, names)
	if err != nil {
		return envoySet{}, err
	}
	set := envoySet{gen: gen, byName: make(map[string]*Resource, len(shares))}
	for _, sh := range shares {
		key := cacheKey{c.sidecar, typ, sh.Key, sh.Name}
		// A share this generation holds is present (nothing absent is
		// held): only the first proxy to ask pays for the lookups.
		if !g.holds(key) && sh.IsAbsent() {
			set.absent = append(set.absent, sh)
			continue
		}
		e, taken := g.entry(key)
		e.fill(g.mesh, func(r *sidecar.Reads) ([]*Resource, error) {
			return s.generate(c.proxy, typ, sh.Name, func() []sidecar.Named { return sh.Generate(r) }, NewResource)
		})
		if e.err != nil {
			return envoySet{}, e.err
		}
		if taken && s.mesh.verify {
			if err := s.verifyTaken(c, typ, sh, e); err != nil {
				return envoySet{}, err
			}
		}
		for _, r := range e.res {
			if _, dup := set.byName[r.Name]; dup {
				continue // two names asked for the same resource
			}
			set.byName[r.Name] = r
			set.list = append(set.list, r)
		}
	}
	return set, nil
}

// placeholders generates what the set's absent names that due says are
// due answer, for one response. A name the mesh has nothing under
// answers a function of the name alone (sidecar.Share.Absent): nothing,
// or a placeholder that tells the client to stop waiting for it.
func (s *Server) placeholders(c *envoyConn, typ string, set envoySet, due func(name string) bool) ([]*Resource, error) {
	var out []*Resource
	for _, sh := range set.absent {
		if !due(sh.Name) {
			continue
		}
		rs, err := s.generate(c.proxy, typ, sh.Name, func() []sidecar.Named { return sh.Generate(nil) }, newBareResource)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if set.byName[r.Name] == nil {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// verifyTaken generates a share taken over from the previous generation
// again and compares it with what was taken: a difference means the
// share read something its Reads did not record, and would be served
// stale. It fails the stream and is logged as the bug it is.
func (s *Server) verifyTaken(c *envoyConn, typ string, sh sidecar.Share, e *cached) error {
	fresh, err := s.generate(c.proxy, typ, sh.Name, func() []sidecar.Named { return sh.Generate(nil) }, newBareResource)
	if err != nil {
		return err
	}
	same := len(fresh) == len(e.res)
	for i := 0; same && i < len(fresh); i++ {
		same = fresh[i].Name == e.res[i].Name && fresh[i].Version == e.res[i].Version
	}
	if same {
		return nil
	}
	s.log.Error("a cached share differs from what its generator makes now: a dependency was not recorded", "proxy", c.proxy.ProxyID, "type", shortType(typ), "share", sh.Name)
	return s.streamError("internal", codes.Internal, "cached %s share %q is stale", shortType(typ), sh.Name)
}

func sameVersion(a, b *Resource) bool { return a.Version == b.Version }

// shares splits what the connection's watch of typ covers into shares
// (names nil: a sidecar's wildcard type).
func (s *Server) shares(mesh Generator, c *envoyConn, typ string, names []string) (out []sidecar.Share, err error) {
	defer s.recoverGenerator(c.proxy, typ, "", &err)
	if c.sidecar {
		return mesh.SidecarShares(sidecarProxy(c.proxy), typ, names), nil
	}
	return mesh.GRPCShares(sidecarProxy(c.proxy), typ, names), nil
}

// generate runs one share's generator and marshals what it returns with
// marshal; name is the share's ("" for a sidecar's wildcard share).
func (s *Server) generate(p Proxy, typ, name string, gen func() []sidecar.Named, marshal func(string, string, proto.Message) (*Resource, error)) (out []*Resource, err error) {
	defer s.recoverGenerator(p, typ, name, &err)
	for _, n := range gen() {
		r, err := marshal(typ, n.Name, n.Resource)
		if err != nil {
			return nil, s.streamError("internal", codes.Internal, "%v", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// recoverGenerator turns a generator's panic into *err. A panic there is
// a bug that input reached: it ends this stream with Internal and is
// logged, and the controller keeps serving everyone else. name is the
// share's, "" for all the watch covers. Deferred.
func (s *Server) recoverGenerator(p Proxy, typ, name string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	name = cmp.Or(name, "*")
	s.log.Error("generating Envoy resources failed", "proxy", p.ProxyID, "type", shortType(typ), "name", name, "panic", r, "stack", string(debug.Stack()))
	*err = s.streamError("internal", codes.Internal, "generating %s %q failed", shortType(typ), name)
}

// sidecarProxy is the generators' view of a proxy.
func sidecarProxy(p Proxy) sidecar.Proxy {
	ips := p.InstanceIPs
	if len(ips) == 0 && p.IP.IsValid() {
		ips = append(ips, p.IP)
	}
	return sidecar.Proxy{Namespace: p.Namespace, Labels: p.Labels, IPs: ips}
}

// recordNACK records a rejection of a response in proxy status.
func (s *Server) recordNACK(c *envoyConn, st *typeState, typ, nonce, msg string) {
	s.metrics.nacks.WithLabelValues(shortType(typ)).Inc()
	if st.nackNonce != nonce {
		s.log.Warn("proxy rejected a response", "proxy", c.proxy.ProxyID, "type", shortType(typ), "nonce", nonce, "error", msg)
	}
	st.nack, st.nackNonce, st.nackAt = msg, nonce, s.cfg.Now()
}

// recordACK records an acceptance of the response nonce in proxy status.
func (s *Server) recordACK(st *typeState, nonce string) {
	st.nonceAcked, st.ackedAt = nonce, s.cfg.Now()
	st.nack, st.nackNonce = "", ""
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
		ts.Wildcard, ts.Resources = w.wildcard, len(w.sent)
		if !w.wildcard {
			ts.Subscribed = len(w.names)
		}
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

// envoyConnections returns the Envoy clients' connections.
func (s *Server) envoyConnections() []*envoyConn {
	s.envoyMu.Lock()
	defer s.envoyMu.Unlock()
	return slices.Collect(maps.Keys(s.envoyConns))
}

// sotwCount is what a state-of-the-world response counts in metrics.
func sotwCount(r *discoveryv3.DiscoveryResponse) (string, int) {
	return r.GetTypeUrl(), len(r.GetResources())
}

// deltaCount is what a Delta response counts in metrics.
func deltaCount(r *discoveryv3.DeltaDiscoveryResponse) (string, int) {
	return r.GetTypeUrl(), len(r.GetResources()) + len(r.GetRemovedResources())
}
