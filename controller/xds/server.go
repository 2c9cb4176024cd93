package xds

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Source is the table index as the server reads it; *index.Index
// implements it.
type Source interface {
	Address(name string) *workloadapi.Address
	Authorization(name string) *security.Authorization
	AddressNames() []string
	AuthorizationNames() []string
}

// Authenticator turns a bearer token and clusterid header into a caller;
// the CA's *authn.Authenticator implements it.
type Authenticator interface {
	Authenticate(ctx context.Context, token, clusterID string) (authn.Caller, error)
}

// Config tunes the server. Zero values take the defaults.
type Config struct {
	// Quiet is how long the tables must be unchanged before a push
	// (default 100ms); MaxDelay bounds how long a change waits (default 1s).
	Quiet, MaxDelay time.Duration
	// MaxPending is how many changed names a connection queues before it
	// compares the whole table instead (default 10,000).
	MaxPending int
	// MaxSubscriptions bounds the names one connection may subscribe to
	// (default 100,000).
	MaxSubscriptions int
	// SendTimeout is how long a proxy may take to read a response before
	// it is disconnected (default 30s).
	SendTimeout time.Duration
	// SendBudget bounds the workload responses encoded and not yet written
	// over all streams (default NewSendBudget(0)); its Codec must be the
	// gRPC server's codec for the bound to cover the transport's queues.
	SendBudget *SendBudget
	// MaxStreams bounds the streams open at once (default 10,000) and
	// MaxStreamsPerCaller those of one caller: the pod of a pod-bound
	// token, else the service account (default 10). Negative: no bound.
	MaxStreams, MaxStreamsPerCaller int
	// MaxNameBytesPerCaller bounds the resource names one caller's
	// streams hold subscribed, over all of them and every type: each
	// name's bytes and about what a watch spends on it (default 16 MiB;
	// negative: no bound). A request past it ends its stream with
	// ResourceExhausted.
	MaxNameBytesPerCaller int64
	// StreamsPerSecond and StreamBurst budget new streams, each of which
	// costs a whole table's response (defaults 25 a second, bursts of 100;
	// negative StreamsPerSecond: no budget). StreamWait is the longest a
	// new stream waits for the budget before it is refused (default 1s;
	// negative: never wait). Only authenticated streams count.
	StreamsPerSecond float64
	StreamBurst      int
	StreamWait       time.Duration
	// SystemNamespace: callers from it may read proxy status over xDS.
	SystemNamespace string
	// ID names this controller instance in proxy status (its pod name).
	ID string
	// Mesh is what Envoy resources for sidecars and proxyless gRPC
	// clients are generated from; nil refuses Envoy types.
	Mesh MeshSource
	// NewGenerator builds the generators of one generation of Mesh
	// (default sidecar.NewMesh).
	NewGenerator func(sidecar.Inputs) Generator
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Defaults of the stream limits.
const (
	DefaultMaxStreams          = 10000
	DefaultMaxStreamsPerCaller = 10
	DefaultStreamsPerSecond    = 25
	DefaultStreamBurst         = 100
	// DefaultMaxNameBytesPerCaller is room for the endpoint and route
	// names of a sidecar that sees about 90,000 clusters.
	DefaultMaxNameBytesPerCaller = 16 << 20
)

func (c Config) withDefaults() Config {
	if c.Quiet <= 0 {
		c.Quiet = 100 * time.Millisecond
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = time.Second
	}
	if c.MaxDelay < c.Quiet {
		c.MaxDelay = c.Quiet
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 10000
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = 100000
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = 30 * time.Second
	}
	if c.SendBudget == nil {
		c.SendBudget = NewSendBudget(0)
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxStreamsPerCaller == 0 {
		c.MaxStreamsPerCaller = DefaultMaxStreamsPerCaller
	}
	if c.MaxNameBytesPerCaller == 0 {
		c.MaxNameBytesPerCaller = DefaultMaxNameBytesPerCaller
	}
	if c.StreamsPerSecond == 0 {
		c.StreamsPerSecond = DefaultStreamsPerSecond
	}
	if c.StreamBurst <= 0 {
		c.StreamBurst = DefaultStreamBurst
	}
	if c.StreamWait == 0 {
		c.StreamWait = time.Second
	}
	if c.SystemNamespace == "" {
		c.SystemNamespace = "istio-system"
	}
	if c.ID == "" {
		c.ID = "canopy-controller"
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// types are the resource types served, in the order a proxy subscribes.
var types = []string{workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL}

// Server is the workload xDS server.
type Server struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer

	cfg       Config
	source    Source
	auth      Authenticator
	admission *admission
	table     *Table
	log       *slog.Logger
	metrics   *metrics
	// building bounds the workload responses being built at once: a whole
	// table's response is megabytes of garbage until it is encoded.
	building *semaphore.Weighted

	ready    chan struct{}
	gen      atomic.Uint64
	connSeq  atomic.Uint64
	connMu   sync.RWMutex
	conns    map[*conn]struct{}
	pushWake chan struct{}

	pendingMu    sync.Mutex
	pendingAddrs map[string]struct{}
	pendingAuthz map[string]struct{}
	// pendingMesh: something Envoy resources read changed.
	pendingMesh bool
	first, last time.Time

	// Envoy clients, sidecars and proxyless gRPC (envoy.go): the mesh
	// they are generated from, its generation, and their connections.
	mesh       *meshCache
	envoyGen   atomic.Uint64
	envoyMu    sync.Mutex
	envoyConns map[*envoyConn]struct{}
}

// New returns a Server reading source and authenticating callers with auth.
func New(cfg Config, source Source, auth Authenticator, log *slog.Logger) (*Server, error) {
	s := &Server{
		cfg:          cfg.withDefaults(),
		source:       source,
		auth:         auth,
		table:        NewTable(),
		log:          log.With("component", "xds"),
		ready:        make(chan struct{}),
		conns:        map[*conn]struct{}{},
		pushWake:     make(chan struct{}, 1),
		pendingAddrs: map[string]struct{}{},
		pendingAuthz: map[string]struct{}{},
		envoyConns:   map[*envoyConn]struct{}{},
		building:     semaphore.NewWeighted(int64(runtime.GOMAXPROCS(0))),
	}
	s.admission = newAdmission(s.cfg)
	if cfg.Mesh != nil {
		// Tests check every share the cache takes over; production trusts
		// the record.
		s.mesh = &meshCache{src: cfg.Mesh, build: cfg.NewGenerator, verify: testing.Testing()}
		if s.mesh.build == nil {
			s.mesh.build = newMeshGenerator
		}
	}
	m, err := newMetrics(s.cfg.Registerer, func() float64 {
		s.connMu.RLock()
		n := len(s.conns)
		s.connMu.RUnlock()
		s.envoyMu.Lock()
		defer s.envoyMu.Unlock()
		return float64(n + len(s.envoyConns))
	}, func() float64 { return float64(s.cfg.SendBudget.Used()) }, func() float64 { return float64(s.admission.names.Total()) })
	if err != nil {
		return nil, fmt.Errorf("xds metrics: %w", err)
	}
	s.metrics = m
	return s, nil
}

// Register adds the aggregated discovery service to g.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s)
}

// Ready is closed once the tables are loaded from the synced informers.
// Until then streams are accepted but neither answered nor their requests
// applied: a proxy's first response is the whole table, never part of it,
// and the versions a reconnecting proxy holds are compared with the whole
// table, so it is sent nothing it has and told to remove only what is
// gone.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Changed queues the names a change set touched for the next push. It
// never blocks; the informers call it.
func (s *Server) Changed(cs index.ChangeSet) {
	if cs.Empty() {
		return
	}
	now := s.cfg.Now()
	s.pendingMu.Lock()
	s.pendingMesh = true
	for _, c := range []struct {
		ch  index.Changes
		dst map[string]struct{}
	}{{cs.Addresses, s.pendingAddrs}, {cs.Authorizations, s.pendingAuthz}} {
		for _, names := range [][]string{c.ch.Added, c.ch.Updated, c.ch.Removed} {
			for _, n := range names {
				c.dst[n] = struct{}{}
			}
		}
	}
	if s.first.IsZero() {
		s.first = now
	}
	s.last = now
	s.pendingMu.Unlock()
	select {
	case s.pushWake <- struct{}{}:
	default:
	}
}

// Run loads the tables once synced is closed, then pushes changes until
// ctx ends.
func (s *Server) Run(ctx context.Context, synced <-chan struct{}) error {
	select {
	case <-synced:
	case <-ctx.Done():
		return nil
	}
	start := s.cfg.Now()
	s.load()
	close(s.ready)
	s.log.Info("workload xDS tables loaded", "addresses", s.table.Len(workloadapi.AddressTypeURL),
		"authorizations", s.table.Len(workloadapi.AuthorizationTypeURL), "took", s.cfg.Now().Sub(start))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.pushWake:
		case <-timer.C:
		}
		s.pendingMu.Lock()
		first, last := s.first, s.last
		s.pendingMu.Unlock()
		if first.IsZero() {
			continue
		}
		due := last.Add(s.cfg.Quiet)
		if limit := first.Add(s.cfg.MaxDelay); limit.Before(due) {
			due = limit
		}
		if wait := due.Sub(s.cfg.Now()); wait > 0 {
			timer.Reset(wait)
			continue
		}
		s.commit()
	}
}

// load puts every resource of the source into the table.
func (s *Server) load() {
	addrs, authz := s.source.AddressNames(), s.source.AuthorizationNames()
	s.pendingMu.Lock()
	for _, n := range addrs {
		s.pendingAddrs[n] = struct{}{}
	}
	for _, n := range authz {
		s.pendingAuthz[n] = struct{}{}
	}
	s.pendingMu.Unlock()
	s.commit()
}

// commit applies the pending names to the table and marks what changed on
// every connection.
func (s *Server) commit() {
	s.pendingMu.Lock()
	addrs, authz, first, meshChanged := s.pendingAddrs, s.pendingAuthz, s.first, s.pendingMesh
	s.pendingAddrs, s.pendingAuthz, s.pendingMesh = map[string]struct{}{}, map[string]struct{}{}, false
	s.first, s.last = time.Time{}, time.Time{}
	s.pendingMu.Unlock()

	changed := map[string][]string{}
	for name := range addrs {
		var msg proto.Message
		if a := s.source.Address(name); a != nil {
			msg = a
		}
		if s.apply(workloadapi.AddressTypeURL, name, msg) {
			changed[workloadapi.AddressTypeURL] = append(changed[workloadapi.AddressTypeURL], name)
		}
	}
	for name := range authz {
		var msg proto.Message
		if a := s.source.Authorization(name); a != nil {
			msg = a
		}
		if s.apply(workloadapi.AuthorizationTypeURL, name, msg) {
			changed[workloadapi.AuthorizationTypeURL] = append(changed[workloadapi.AuthorizationTypeURL], name)
		}
	}
	if meshChanged {
		s.envoyChanged()
	}
	if len(changed) == 0 {
		return
	}
	s.gen.Add(1)
	if first.IsZero() {
		first = s.cfg.Now()
	}
	s.connMu.RLock()
	defer s.connMu.RUnlock()
	for c := range s.conns {
		c.mark(changed, first, s.cfg.MaxPending)
	}
}

func (s *Server) apply(typeURL, name string, msg proto.Message) bool {
	if msg == nil {
		return s.table.Put(typeURL, name, nil)
	}
	r, err := NewResource(typeURL, name, msg)
	if err != nil {
		// The builders produced it; a failure here is a bug, and the old
		// resource (if any) stays rather than vanishing from every proxy.
		s.log.Error("cannot marshal resource", "type", typeURL, "name", name, "err", err)
		return false
	}
	return s.table.Put(typeURL, name, r)
}

func (s *Server) addConn(c *conn) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	s.conns[c] = struct{}{}
}

func (s *Server) removeConn(c *conn) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	delete(s.conns, c)
}

// connections returns the open connections.
func (s *Server) connections() []*conn {
	s.connMu.RLock()
	defer s.connMu.RUnlock()
	out := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}
