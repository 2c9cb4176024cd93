package xds

import (
	"maps"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/sidecar"
)

// serveEnvoy serves an Envoy client's state-of-the-world stream from its
// first request on. Requests follow istiod's rules: a NACK is recorded
// and not answered, a request with another nonce than the last
// response's is stale and ignored, an ACK is answered only when it
// changes the names (or by the warming rule), and a change of the mesh
// sends each type whose resources changed.
func (s *Server) serveEnvoy(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], caller authn.Caller, proxy Proxy, first *discoveryv3.DiscoveryRequest) error {
	c, done := s.newEnvoyConn(stream.Context(), caller, proxy, false)
	defer done()
	handle := func(req *discoveryv3.DiscoveryRequest) ([]*discoveryv3.DiscoveryResponse, error) {
		resp, err := s.envoyRequest(c, req)
		if err != nil || resp == nil {
			return nil, err
		}
		return []*discoveryv3.DiscoveryResponse{resp}, nil
	}
	return serveEnvoyStream(s, c, stream, first, handle, func() ([]*discoveryv3.DiscoveryResponse, error) { return s.envoyPush(c) }, sotwCount)
}

// envoyPush builds a response for every type whose resources changed, in
// push order.
func (s *Server) envoyPush(c *envoyConn) ([]*discoveryv3.DiscoveryResponse, error) {
	return pushChanged(c, func(typ string, w *envoyWatch, always bool) (*discoveryv3.DiscoveryResponse, error) {
		return s.envoyRespond(c, typ, w, always)
	})
}

// pushChanged builds, under the connection's lock, a response for every
// watched type whose resources changed, in push order, with respond (a
// nil response: nothing changed).
func pushChanged[R any](c *envoyConn, respond func(typ string, w *envoyWatch, always bool) (*R, error)) ([]*R, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*R
	clustersSent := false
	for _, typ := range envoyTypes {
		if w := c.watches[typ]; w != nil {
			// A cluster Envoy replaces warms until its endpoints come
			// again, and Envoy does not ask for them (its names did not
			// change): endpoints follow every clusters push to a sidecar.
			always := typ == sidecar.EndpointType && clustersSent && c.sidecar
			resp, err := respond(typ, w, always)
			if err != nil {
				return nil, err
			}
			if resp != nil {
				out = append(out, resp)
				clustersSent = clustersSent || typ == sidecar.ClusterType
			}
		}
	}
	return out, nil
}

// ignoreType answers a sidecar's request for a type this server does not
// serve (the agent's name table or proxy config, health information):
// as istiod does for a type it has no generator for, with nothing, and
// the stream goes on.
func (s *Server) ignoreType(c *envoyConn, typ string) {
	s.log.Debug("type not served to sidecars; request ignored", "proxy", c.proxy.ProxyID, "type_url", typ)
}

// envoyRequest applies one state-of-the-world request (sidecar wire
// contract §1.3). It returns the response to send, if any.
func (s *Server) envoyRequest(c *envoyConn, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	typ := req.GetTypeUrl()
	if !isEnvoyType(typ) {
		if c.sidecar {
			s.ignoreType(c, typ)
			return nil, nil
		}
		return nil, s.streamError("type", codes.InvalidArgument, "unsupported type URL %q for a proxyless gRPC client", typ)
	}
	if err := s.checkNames(typ, s.cfg.MaxSubscriptions, req.GetResourceNames()); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.states[typ]
	if st == nil {
		st = &typeState{}
		c.states[typ] = st
	}
	w := c.watches[typ]
	nonce := req.GetResponseNonce()
	if req.GetErrorDetail() != nil {
		s.recordNACK(c, st, typ, nonce, req.GetErrorDetail().GetMessage())
		return nil, nil
	}
	names := make(map[string]struct{}, len(req.GetResourceNames()))
	for _, n := range req.GetResourceNames() {
		names[n] = struct{}{}
	}
	wildcard := c.sidecar && sidecar.IsWildcard(typ)
	if len(names) == 0 && !wildcard {
		// Nothing wanted any more: the type is unsubscribed. For a
		// sidecar's clusters and listeners no names means everything.
		s.dropEnvoyWatch(c, typ)
		return nil, nil
	}
	if nonce == "" || w == nil {
		// A new watch (or a reconnecting client's first request).
		s.dropEnvoyWatch(c, typ)
		w = newEnvoyWatch(wildcard)
		w.setNames(names)
		c.watches[typ] = w
		if err := s.settleEnvoyNames(c, typ, w); err != nil {
			return nil, err
		}
		if other := c.watches[warms[typ]]; other != nil {
			other.alwaysRespond = true
		}
		return s.envoyRespond(c, typ, w, true)
	}
	if nonce != w.nonce {
		return nil, nil // stale: an answer to a response since replaced
	}
	s.recordACK(st, nonce)
	if !c.sidecar {
		if !maps.Equal(names, w.names) {
			w.setNames(names)
			if err := s.settleEnvoyNames(c, typ, w); err != nil {
				return nil, err
			}
			return s.envoyRespond(c, typ, w, true)
		}
		if w.alwaysRespond {
			w.alwaysRespond = false
			return s.envoyRespond(c, typ, w, true)
		}
		return nil, nil
	}
	// A sidecar, by istiod's rules: answered when a name was added (any
	// change, for a wildcard type) or by the warming rule.
	added, removed := false, false
	for n := range names {
		if _, ok := w.names[n]; !ok {
			added = true
		}
	}
	for n := range w.names {
		if _, ok := names[n]; !ok {
			removed = true
			if !wildcard {
				delete(w.sent, n) // dropped by the proxy; not pushed again
			}
		}
	}
	w.setNames(names)
	if err := s.settleEnvoyNames(c, typ, w); err != nil {
		return nil, err
	}
	if w.alwaysRespond || added || (wildcard && removed) {
		w.alwaysRespond = false
		return s.envoyRespond(c, typ, w, true)
	}
	return nil, nil
}

// envoyRespond builds the watch's state-of-the-world response: always
// when asked for, else only when its resources differ from what was last
// sent (nil then). The caller holds c.mu.
func (s *Server) envoyRespond(c *envoyConn, typ string, w *envoyWatch, always bool) (*discoveryv3.DiscoveryResponse, error) {
	set, err := s.envoyGenerate(c, typ, w)
	if err != nil {
		return nil, err
	}
	// What the client holds of names the mesh has nothing under is not
	// remembered: their answers depend on the name alone, so only what
	// the mesh has can have changed.
	if !always && maps.EqualFunc(set.byName, w.sent, sameVersion) {
		return nil, nil
	}
	// A pushed endpoint response carries only the assignments that
	// changed: clients keep the others (endpoints are not a type whose
	// every response is the whole set), and one endpoint's change would
	// otherwise resend every assignment to every sidecar. Of the names
	// the mesh has nothing under, those changed are those it had
	// something under until now.
	onlyChanged := !always && typ == sidecar.EndpointType
	absent, err := s.placeholders(c, typ, set, func(name string) bool { return !onlyChanged || w.sent[name] != nil })
	if err != nil {
		return nil, err
	}
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: typ, VersionInfo: strconv.FormatUint(set.gen, 10), ControlPlane: s.controlPlane(), Nonce: c.nextNonce(),
		Resources: make([]*anypb.Any, 0, len(set.list)+len(absent))}
	for _, r := range set.list {
		if onlyChanged {
			if old := w.sent[r.Name]; old != nil && old.Version == r.Version {
				continue
			}
		}
		resp.Resources = append(resp.Resources, r.Body)
	}
	for _, r := range absent {
		resp.Resources = append(resp.Resources, r.Body)
	}
	w.sent, w.nonce = set.byName, resp.Nonce
	st := c.states[typ]
	st.nonceSent, st.sentAt = resp.Nonce, s.cfg.Now()
	return resp, nil
}
