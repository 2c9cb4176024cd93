package xds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Debug types (wire contract §8.3).
const (
	// SynczTypeURL asks for every connected proxy's sync status.
	SynczTypeURL = "istio.io/debug/syncz"
	debugPrefix  = "istio.io/debug"
)

// maxQueuedDebug bounds the debug responses waiting on one stream.
const maxQueuedDebug = 4

// typeState is the sync state of one watch, for proxy status.
type typeState struct {
	nonceSent, nonceAcked string
	sentAt, ackedAt       time.Time
	// nack is the last rejection, cleared by a later ACK.
	nack      string
	nackNonce string
	nackAt    time.Time
}

// conn is one proxy's Delta ADS stream.
type conn struct {
	id          string
	proxy       Proxy
	caller      authn.Caller
	peer        string
	connectedAt time.Time

	wake chan struct{}
	// cancel ends the stream with a cause.
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	watches map[string]*watch
	states  map[string]*typeState
	debug   []*discoveryv3.DeltaDiscoveryResponse
	nonce   uint64
	// closed: the stream is over and its names' charge returned; a
	// request still being applied changes nothing.
	closed bool
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// mark queues changed names on the connection's watches.
func (c *conn) mark(changed map[string][]string, at time.Time, limit int) {
	c.mu.Lock()
	wake := false
	for typ, names := range changed {
		if w := c.watches[typ]; w != nil {
			w.mark(names, at, limit)
			wake = true
		}
	}
	c.mu.Unlock()
	if wake {
		c.signal()
	}
}

func (c *conn) nextNonce() string {
	c.nonce++
	return strconv.FormatUint(c.nonce, 10)
}

// streamError ends a stream with a status and counts it by reason.
func (s *Server) streamError(reason string, code codes.Code, format string, args ...any) error {
	s.metrics.rejected.WithLabelValues(reason).Inc()
	return status.Errorf(code, format, args...)
}

// authenticate checks the caller's bearer token and clusterid header.
func (s *Server) authenticate(ctx context.Context) (authn.Caller, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token := ""
	if v := md.Get("authorization"); len(v) > 0 {
		if t, ok := strings.CutPrefix(v[0], "Bearer "); ok {
			token = strings.TrimSpace(t)
		}
	}
	cluster := ""
	if v := md.Get("clusterid"); len(v) > 0 {
		cluster = v[0]
	}
	caller, err := s.auth.Authenticate(ctx, token, cluster)
	if errors.Is(err, authn.ErrThrottled) {
		return authn.Caller{}, s.streamError("authn_throttled", codes.ResourceExhausted, "authentication: %v", err)
	}
	if err != nil {
		return authn.Caller{}, s.streamError("unauthenticated", codes.Unauthenticated, "authentication failed: %v", err)
	}
	return caller, nil
}

// authorize checks the node against the caller's identity
// (wire contract §2.2).
func (s *Server) authorize(caller authn.Caller, p Proxy) error {
	if caller.Namespace != p.Namespace {
		return s.streamError("identity", codes.PermissionDenied,
			"caller %s/%s may not act for a proxy in namespace %q", caller.Namespace, caller.ServiceAccount, p.Namespace)
	}
	if p.ServiceAccount != "" && caller.ServiceAccount != p.ServiceAccount {
		return s.streamError("identity", codes.PermissionDenied,
			"caller %s/%s may not act for service account %q", caller.Namespace, caller.ServiceAccount, p.ServiceAccount)
	}
	if p.ClusterID != "" && caller.Cluster != p.ClusterID {
		return s.streamError("identity", codes.PermissionDenied,
			"caller of cluster %q may not act for a proxy of cluster %q", caller.Cluster, p.ClusterID)
	}
	return nil
}

// open parses a stream's first request's node and checks it against the
// authenticated caller.
func (s *Server) open(caller authn.Caller, node *corev3.Node) (Proxy, error) {
	p, err := ParseNode(node)
	if err != nil {
		return Proxy{}, s.streamError("node", codes.InvalidArgument, "%v", err)
	}
	if err := s.authorize(caller, p); err != nil {
		return Proxy{}, err
	}
	return p, nil
}

// DeltaAggregatedResources serves one proxy's Delta ADS stream: the
// workload types to node proxies, and Envoy types to sidecars and
// proxyless gRPC clients (envoy_delta.go), told apart by the first
// request.
func (s *Server) DeltaAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	// The caller is authenticated from the stream's headers before its
	// first message is read: a caller without a valid token never makes
	// the server receive (and hold) a request of up to the transport's
	// message limit.
	caller, err := s.authenticate(stream.Context())
	if err != nil {
		return err
	}
	release, err := s.admit(stream.Context(), caller)
	if err != nil {
		return err
	}
	defer release()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	proxy, err := s.open(caller, first.GetNode())
	if err != nil {
		return err
	}
	// Envoy types are for sidecars and proxyless clients; a ztunnel
	// asking for one is told what this stream serves, below.
	if proxy.Type != "ztunnel" || proxy.Generator == "grpc" {
		if envoy, err := s.envoyStream(proxy, first.GetTypeUrl()); err != nil {
			return err
		} else if envoy {
			return s.serveEnvoyDelta(stream, caller, proxy, first)
		}
	}
	c := &conn{
		id:          proxy.ProxyID + "-" + strconv.FormatUint(s.connSeq.Add(1), 10),
		proxy:       proxy,
		caller:      caller,
		connectedAt: s.cfg.Now(),
		wake:        make(chan struct{}, 1),
		watches:     map[string]*watch{},
		states:      map[string]*typeState{},
	}
	if p, ok := peer.FromContext(stream.Context()); ok {
		c.peer = p.Addr.String()
	}
	log := s.log.With("proxy", proxy.ProxyID, "conn", c.id)
	s.addConn(c)
	defer s.removeConn(c)
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closed = true
		for _, w := range c.watches {
			s.releaseNames(&w.charge, caller)
		}
	}()
	log.Info("proxy connected", "type", proxy.Type, "node", proxy.NodeName, "peer", c.peer)
	defer log.Info("proxy disconnected")

	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	c.cancel = cancel
	go func() { cancel(s.sendLoop(ctx, c, stream)) }()
	go func() {
		// Requests wait for the tables: a reconnecting proxy's held
		// versions compared with a table still loading would look stale,
		// and every resource would be sent again or removed.
		select {
		case <-s.ready:
		case <-ctx.Done():
			return
		}
		req := first
		for {
			if err := s.handle(c, req); err != nil {
				cancel(err)
				return
			}
			var err error
			if req, err = stream.Recv(); err != nil {
				cancel(err)
				return
			}
		}
	}()
	<-ctx.Done()
	err = context.Cause(ctx)
	if errors.Is(err, io.EOF) || (errors.Is(err, context.Canceled) && stream.Context().Err() != nil) {
		return nil // the proxy closed the stream or went away
	}
	if _, ok := status.FromError(err); ok || err == nil {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// handle applies one request: an ACK or NACK, subscription changes, or a
// debug query.
func (s *Server) handle(c *conn, req *discoveryv3.DeltaDiscoveryRequest) error {
	typ := req.GetTypeUrl()
	if strings.HasPrefix(typ, debugPrefix) {
		return s.handleDebugDelta(c, req)
	}
	if typ != workloadapi.AddressTypeURL && typ != workloadapi.AuthorizationTypeURL {
		return s.streamError("type", codes.InvalidArgument,
			"unsupported type URL %q: this server serves %s and %s over Delta ADS", typ, workloadapi.AddressTypeURL, workloadapi.AuthorizationTypeURL)
	}
	sub := subscription{subscribe: req.GetResourceNamesSubscribe(), unsubscribe: req.GetResourceNamesUnsubscribe()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	st := c.states[typ]
	if nonce := req.GetResponseNonce(); nonce != "" && st != nil && nonce == st.nonceSent {
		now := s.cfg.Now()
		if msg := req.GetErrorDetail().GetMessage(); req.GetErrorDetail() != nil {
			s.metrics.nacks.WithLabelValues(shortType(typ)).Inc()
			if st.nackNonce != nonce {
				s.log.Warn("proxy rejected a response", "proxy", c.proxy.ProxyID, "type", shortType(typ), "nonce", nonce, "error", msg)
			}
			st.nack, st.nackNonce, st.nackAt = msg, nonce, now
		} else {
			st.nonceAcked, st.ackedAt = nonce, now
			st.nack, st.nackNonce = "", ""
		}
	}
	w := c.watches[typ]
	if w == nil {
		if req.GetResponseNonce() != "" && len(sub.subscribe) == 0 && len(sub.unsubscribe) == 0 {
			return nil // an ACK of a previous stream's response
		}
		w = newWatch(typ)
		sub.initialVersions = req.GetInitialResourceVersions()
		if err := w.start(s.table, sub, s.cfg.MaxSubscriptions); err != nil {
			return s.streamError("limit", codes.ResourceExhausted, "%s: %v", shortType(typ), err)
		}
		c.watches[typ] = w
		c.states[typ] = &typeState{}
	} else if err := w.update(s.table, sub, s.cfg.MaxSubscriptions); err != nil {
		return s.streamError("limit", codes.ResourceExhausted, "%s: %v", shortType(typ), err)
	}
	if err := s.settleNames(&w.charge, c.caller, shortType(typ)); err != nil {
		return err
	}
	if w.pending() {
		c.signal()
	}
	return nil
}

// sendLoop sends what each watch has pending, and queued debug answers,
// until ctx ends. It alone sends on the stream.
func (s *Server) sendLoop(ctx context.Context, c *conn, stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	for {
		for {
			resp, oldest, err := s.buildResponse(ctx, c)
			if err != nil {
				return nil // the stream ended while waiting
			}
			if resp == nil {
				break
			}
			// The response's share of the budget carries the send
			// deadline (settle), from before Send until gRPC has written
			// it: no timer of sendWithin's is needed here.
			err = sendError(ctx, stream.Send(resp))
			s.cfg.SendBudget.sent(resp)
			if err != nil {
				return err
			}
			if short := shortType(resp.TypeUrl); !strings.HasPrefix(resp.TypeUrl, debugPrefix) {
				s.metrics.pushes.WithLabelValues(short).Inc()
				s.metrics.resourcesSent.WithLabelValues(short).Add(float64(len(resp.Resources) + len(resp.RemovedResources)))
				if !oldest.IsZero() {
					s.metrics.pushLatency.WithLabelValues(short).Observe(s.cfg.Now().Sub(oldest).Seconds())
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		}
	}
}

// buildResponse builds the next response the connection owes (nil when
// none) with its share of the send budget. A response that will carry a
// whole table takes its share before it is built, and at most GOMAXPROCS
// are built at once: what waits holds no response yet. An error means ctx
// ended.
func (s *Server) buildResponse(ctx context.Context, c *conn) (*discoveryv3.DeltaDiscoveryResponse, time.Time, error) {
	h, err := s.cfg.SendBudget.reserve(ctx, callerKey(c.caller), s.nextWeight(c))
	if err != nil {
		return nil, time.Time{}, err
	}
	if err := s.building.Acquire(ctx, 1); err != nil {
		h.release()
		return nil, time.Time{}, err
	}
	resp, oldest := s.nextResponse(c)
	s.building.Release(1)
	if resp == nil {
		h.release()
		return nil, oldest, nil
	}
	if err := h.settle(ctx, resp, s.cfg.SendTimeout, func() { s.tooSlow(ctx, c.id, c.cancel) }); err != nil {
		h.release()
		return nil, time.Time{}, err
	}
	return resp, oldest, nil
}

// nextWeight estimates the encoded size of the next response when it
// will carry a type's whole table (a wildcard watch's first response or
// its fallback after too many changes), else 0.
func (s *Server) nextWeight(c *conn) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.debug) > 0 {
		return 0
	}
	for _, typ := range types {
		if w := c.watches[typ]; w != nil && w.pending() {
			if w.wildcard && w.full {
				return s.table.WireSize(typ)
			}
			return 0
		}
	}
	return 0
}

// tooSlow ends a stream (ctx, cancelled with cancel) whose proxy has not
// read a response within the send timeout; a stream already over is not
// counted.
func (s *Server) tooSlow(ctx context.Context, connID string, cancel context.CancelCauseFunc) {
	if ctx.Err() != nil {
		return
	}
	s.metrics.cutOff.Inc()
	s.log.Warn("proxy too slow to read; disconnecting", "conn", connID, "timeout", s.cfg.SendTimeout)
	cancel(s.streamError("slow", codes.ResourceExhausted, "proxy did not read a response within %s", s.cfg.SendTimeout))
}

// nextResponse builds the next response the connection owes, or nil.
func (s *Server) nextResponse(c *conn) (*discoveryv3.DeltaDiscoveryResponse, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.debug) > 0 {
		resp := c.debug[0]
		c.debug = c.debug[1:]
		resp.Nonce = c.nextNonce()
		return resp, time.Time{}
	}
	for _, typ := range types {
		w := c.watches[typ]
		if w == nil || !w.pending() {
			continue
		}
		d := w.next(s.table, c.proxy.NodeName)
		if d.empty() && !d.initial {
			continue
		}
		resp := &discoveryv3.DeltaDiscoveryResponse{
			TypeUrl:           typ,
			SystemVersionInfo: strconv.FormatUint(s.gen.Load(), 10),
			Resources:         make([]*discoveryv3.Resource, len(d.resources)),
			RemovedResources:  d.removed,
			Nonce:             c.nextNonce(),
		}
		for i, r := range d.resources {
			if w.wildcard {
				resp.Resources[i] = r.Wire()
			} else {
				// Aliases are for on-demand answers (wire contract §1.9).
				resp.Resources[i] = &discoveryv3.Resource{Name: r.Name, Version: r.Version, Resource: r.Body, Aliases: r.Aliases}
			}
		}
		st := c.states[typ]
		st.nonceSent, st.sentAt = resp.Nonce, s.cfg.Now()
		return resp, d.oldest
	}
	return nil, time.Time{}
}

// sendWithin sends one response with send. A proxy that does not take it
// within the send timeout is disconnected (cancel): the stream's end
// unblocks Send, and the proxy never holds more than one response's
// memory here.
func sendWithin[R any](ctx context.Context, s *Server, connID string, cancel context.CancelCauseFunc, send func(R) error, resp R) error {
	timer := time.AfterFunc(s.cfg.SendTimeout, func() { s.tooSlow(ctx, connID, cancel) })
	defer timer.Stop()
	return sendError(ctx, send(resp))
}

// sendError is what a stream's Send returned as the sender reports it:
// the stream's own cause when it ended first.
func sendError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("send: %w", err)
}
