package xds

import (
	"maps"
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/sidecar"
)

// serveEnvoyDelta serves an Envoy client's Delta stream from its first
// request on, by istiod's rules (sidecar wire contract §1.1, §1.3):
//
//   - A sidecar's clusters and listeners are wildcard: the watch covers
//     everything the proxy sees, whatever names it subscribes ("*" or
//     none). Endpoints and routes, and every type of a proxyless client,
//     are watched by resource_names_subscribe and
//     resource_names_unsubscribe; "*" is no name there.
//   - A type's first request is answered; initial_resource_versions (a
//     reconnect) is what the client holds: the answer leaves out what it
//     holds at the current version and removes what no longer exists.
//   - A NACK is recorded and not answered. A request with a nonce other
//     than the type's last is stale: not an ACK, and answered only if it
//     subscribes to a new name (a Delta subscription change is never
//     sent again, so it is applied whatever the nonce). An ACK is
//     answered only when it subscribes to a new name (any change, for a
//     wildcard type).
//   - Warming: a new cluster (listener) watch makes the endpoint (route)
//     watch answer its next request; and every answered cluster request
//     is followed by the endpoints, so clusters that changed across a
//     reconnect never wait for endpoints the proxy will not ask for
//     again.
//   - Every response carries the whole set the generators return for the
//     watch, each resource with its version; system_version_info is the
//     mesh generation, the nonce unique on the stream, and
//     removed_resources what the client held and no longer gets, and
//     newly subscribed names nothing answers. The placeholders of names
//     the mesh has nothing under (sidecar.Share.Absent) are sent once:
//     in the watch's first response, when the name is subscribed, and
//     when the mesh stops having something under it.
//   - A change of the mesh sends each type whose resources changed.
func (s *Server) serveEnvoyDelta(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], caller authn.Caller, proxy Proxy, first *discoveryv3.DeltaDiscoveryRequest) error {
	c, done := s.newEnvoyConn(stream.Context(), caller, proxy, true)
	defer done()
	handle := func(req *discoveryv3.DeltaDiscoveryRequest) ([]*discoveryv3.DeltaDiscoveryResponse, error) {
		return s.envoyDeltaRequest(c, req)
	}
	return serveEnvoyStream(s, c, stream, first, handle, func() ([]*discoveryv3.DeltaDiscoveryResponse, error) { return s.envoyPushDelta(c) }, deltaCount)
}

// envoyPushDelta builds a Delta response for every type whose resources
// changed, in push order.
func (s *Server) envoyPushDelta(c *envoyConn) ([]*discoveryv3.DeltaDiscoveryResponse, error) {
	return pushChanged(c, func(typ string, w *envoyWatch, always bool) (*discoveryv3.DeltaDiscoveryResponse, error) {
		return s.envoyRespondDelta(c, typ, w, always)
	})
}

// envoyDeltaRequest applies one Delta request and returns the responses
// to send.
func (s *Server) envoyDeltaRequest(c *envoyConn, req *discoveryv3.DeltaDiscoveryRequest) ([]*discoveryv3.DeltaDiscoveryResponse, error) {
	typ := req.GetTypeUrl()
	if !isEnvoyType(typ) {
		if c.sidecar {
			s.ignoreType(c, typ)
			return nil, nil
		}
		return nil, s.streamError("type", codes.InvalidArgument, "unsupported type URL %q for a proxyless gRPC client", typ)
	}
	limit := s.cfg.MaxSubscriptions
	if err := s.checkNames(typ, limit, req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(),
		slices.Collect(maps.Keys(req.GetInitialResourceVersions()))); err != nil {
		return nil, err
	}
	tooMany := func(w *envoyWatch) error {
		if len(w.names) > limit {
			return s.streamError("limit", codes.ResourceExhausted, "%s: %d subscribed names, limit %d", shortType(typ), len(w.names), limit)
		}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w, st := c.watches[typ], c.states[typ]
	nonce := req.GetResponseNonce()
	if req.GetErrorDetail() != nil {
		if st != nil {
			s.recordNACK(c, st, typ, nonce, req.GetErrorDetail().GetMessage())
		}
		return nil, nil
	}
	if w == nil {
		w = newEnvoyWatch(c.sidecar && sidecar.IsWildcard(typ))
		w.initial = true
		for name, version := range req.GetInitialResourceVersions() {
			w.sent[name] = &Resource{TypeURL: typ, Name: name, Version: version}
			if !w.wildcard {
				w.addName(name)
			}
		}
		w.subscribe(req.GetResourceNamesSubscribe())
		if err := tooMany(w); err != nil {
			return nil, err
		}
		c.watches[typ], c.states[typ] = w, &typeState{}
		if err := s.settleEnvoyNames(c, typ, w); err != nil {
			return nil, err
		}
		if other := c.watches[warms[typ]]; other != nil {
			other.alwaysRespond = true
		}
		return s.envoyAnswerDelta(c, typ, w)
	}
	stale := nonce != "" && nonce != w.nonce
	if nonce != "" && !stale {
		s.recordACK(st, nonce)
	}
	added := w.subscribe(req.GetResourceNamesSubscribe())
	removed := w.unsubscribe(req.GetResourceNamesUnsubscribe())
	if err := tooMany(w); err != nil {
		return nil, err
	}
	if err := s.settleEnvoyNames(c, typ, w); err != nil {
		return nil, err
	}
	respond := added || (w.wildcard && removed)
	if !stale && w.alwaysRespond {
		w.alwaysRespond = false
		respond = true
	}
	if !respond {
		return nil, nil
	}
	return s.envoyAnswerDelta(c, typ, w)
}

// subscribe adds names to a watch and reports whether one was new. "*"
// is no name: a wildcard watch covers everything anyway, and any other
// is never wildcard.
func (w *envoyWatch) subscribe(names []string) bool {
	added := false
	for _, n := range names {
		if n == "*" || !w.addName(n) {
			continue
		}
		added = true
		if !w.wildcard {
			w.answer[n] = struct{}{}
		}
	}
	return added
}

// unsubscribe removes names from a watch and reports whether one was
// there. The client drops what it unsubscribed from: it is neither sent
// again nor removed.
func (w *envoyWatch) unsubscribe(names []string) bool {
	removed := false
	for _, n := range names {
		if !w.delName(n) {
			continue
		}
		removed = true
		if !w.wildcard {
			delete(w.answer, n)
			delete(w.sent, n)
		}
	}
	return removed
}

// envoyAnswerDelta answers a request for typ; an answer of clusters is
// followed by the endpoints (istiod's forced endpoint push), which also
// settles the warming rule for them. The caller holds c.mu.
func (s *Server) envoyAnswerDelta(c *envoyConn, typ string, w *envoyWatch) ([]*discoveryv3.DeltaDiscoveryResponse, error) {
	resp, err := s.envoyRespondDelta(c, typ, w, true)
	if err != nil {
		return nil, err
	}
	out := []*discoveryv3.DeltaDiscoveryResponse{resp}
	if e := c.watches[sidecar.EndpointType]; typ == sidecar.ClusterType && e != nil {
		e.alwaysRespond = false
		resp, err := s.envoyRespondDelta(c, sidecar.EndpointType, e, true)
		if err != nil {
			return nil, err
		}
		out = append(out, resp)
	}
	return out, nil
}

// envoyRespondDelta builds the watch's Delta response: always when asked
// for, else only when its resources differ from what the client holds
// (nil then). The caller holds c.mu.
func (s *Server) envoyRespondDelta(c *envoyConn, typ string, w *envoyWatch, always bool) (*discoveryv3.DeltaDiscoveryResponse, error) {
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
	absent, err := s.placeholders(c, typ, set, func(name string) bool {
		_, asked := w.answer[name]
		return w.initial || asked || w.sent[name] != nil
	})
	if err != nil {
		return nil, err
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{
		TypeUrl: typ, SystemVersionInfo: strconv.FormatUint(set.gen, 10), ControlPlane: s.controlPlane(), Nonce: c.nextNonce(),
		Resources: make([]*discoveryv3.Resource, 0, len(set.list)+len(absent)),
	}
	placeheld := make(map[string]bool, len(absent))
	for _, r := range absent {
		placeheld[r.Name] = true
	}
	for _, rs := range [][]*Resource{set.list, absent} {
		for _, r := range rs {
			if held := w.sent[r.Name]; w.initial && held != nil && held.Version == r.Version {
				continue // held since before the reconnect
			}
			resp.Resources = append(resp.Resources, r.Wire())
		}
	}
	answered := func(n string) bool { return set.byName[n] != nil || placeheld[n] }
	removed := map[string]struct{}{}
	for n := range w.sent {
		if !answered(n) {
			removed[n] = struct{}{}
		}
	}
	for n := range w.answer {
		if !answered(n) {
			removed[n] = struct{}{}
		}
	}
	resp.RemovedResources = slices.Sorted(maps.Keys(removed))
	w.sent, w.nonce, w.initial = set.byName, resp.Nonce, false
	clear(w.answer)
	st := c.states[typ]
	st.nonceSent, st.sentAt = resp.Nonce, s.cfg.Now()
	return resp, nil
}
