package xds

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/internal/version"
)

// Per-type sync states, as istioctl proxy-status prints them.
const (
	Synced  = "SYNCED"
	Stale   = "STALE"
	NotSent = "NOT SENT"
	Error   = "ERROR"
)

// TypeStatus is one proxy's state for one type.
type TypeStatus struct {
	Type    string `json:"type"`
	TypeURL string `json:"typeUrl"`
	Status  string `json:"status"`
	// Wildcard, or the number of on-demand subscriptions.
	Wildcard   bool      `json:"wildcard"`
	Subscribed int       `json:"subscribed,omitempty"`
	Resources  int       `json:"resources"`
	NonceSent  string    `json:"nonceSent,omitempty"`
	NonceAcked string    `json:"nonceAcked,omitempty"`
	LastSent   time.Time `json:"lastSent,omitzero"`
	LastAcked  time.Time `json:"lastAcked,omitzero"`
	NACK       string    `json:"nack,omitempty"`
	NACKAt     time.Time `json:"nackAt,omitzero"`
}

// ProxyStatus is one connected proxy.
type ProxyStatus struct {
	ProxyID     string       `json:"proxyID"`
	NodeID      string       `json:"nodeID"`
	Connection  string       `json:"connection"`
	ProxyType   string       `json:"proxyType"`
	Cluster     string       `json:"cluster,omitempty"`
	Namespace   string       `json:"namespace"`
	Node        string       `json:"node,omitempty"`
	Version     string       `json:"version,omitempty"`
	Peer        string       `json:"peer,omitempty"`
	ConnectedAt time.Time    `json:"connectedAt"`
	Types       []TypeStatus `json:"types"`
}

// Status returns every connected proxy, sorted by proxy ID.
func (s *Server) Status() []ProxyStatus {
	var out []ProxyStatus
	for _, c := range s.connections() {
		out = append(out, c.status())
	}
	for _, c := range s.envoyConnections() {
		out = append(out, c.status())
	}
	slices.SortFunc(out, func(a, b ProxyStatus) int {
		return strings.Compare(a.ProxyID+"\x00"+a.Connection, b.ProxyID+"\x00"+b.Connection)
	})
	return out
}

func (c *conn) status() ProxyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := newProxyStatus(c.proxy, c.id, c.peer, c.connectedAt)
	for _, typ := range types {
		w, st := c.watches[typ], c.states[typ]
		if w == nil {
			continue
		}
		ts := st.typeStatus(typ)
		ts.Wildcard, ts.Subscribed, ts.Resources = w.wildcard, len(w.subscribed), w.sent.len()
		ps.Types = append(ps.Types, ts)
	}
	return ps
}

// newProxyStatus is a connection's status without its types.
func newProxyStatus(p Proxy, conn, peer string, connectedAt time.Time) ProxyStatus {
	return ProxyStatus{
		ProxyID: p.ProxyID, NodeID: p.ID, Connection: conn, ProxyType: p.Type,
		Cluster: p.ClusterID, Namespace: p.Namespace, Node: p.NodeName,
		Version: p.IstioVersion, Peer: peer, ConnectedAt: connectedAt,
	}
}

// typeStatus is one type's sync state, without what the watch holds.
func (st *typeState) typeStatus(typ string) TypeStatus {
	return TypeStatus{
		Type: shortType(typ), TypeURL: typ, Status: st.status(),
		NonceSent: st.nonceSent, NonceAcked: st.nonceAcked, LastSent: st.sentAt, LastAcked: st.ackedAt,
		NACK: st.nack, NACKAt: st.nackAt,
	}
}

// status is the wire contract §8.3 state: a rejection of the last response is
// an error; otherwise synced once the last nonce sent is acknowledged.
func (st *typeState) status() string {
	switch {
	case st.nonceSent == "":
		return NotSent
	case st.nack != "" && st.nackNonce == st.nonceSent:
		return Error
	case st.nonceAcked == st.nonceSent:
		return Synced
	}
	return Stale
}

var configStatus = map[string]statusv3.ConfigStatus{
	Synced: statusv3.ConfigStatus_SYNCED, Stale: statusv3.ConfigStatus_STALE,
	NotSent: statusv3.ConfigStatus_NOT_SENT, Error: statusv3.ConfigStatus_ERROR,
}

// clientConfigs returns one CSDS ClientConfig per connected proxy, as
// istioctl proxy-status reads them: the node, named by its proxy ID
// ("<pod>.<namespace>", which istioctl prints as NAME) with CLUSTER_ID,
// NAMESPACE and ISTIO_VERSION, and a config status per subscribed type,
// with the time of the last ACK as its age. A connection that watches no
// type (a debug client asking over Delta ADS) is no proxy and is left
// out, as istiod leaves out its debug clients.
func (s *Server) clientConfigs() []*statusv3.ClientConfig {
	var out []*statusv3.ClientConfig
	for _, ps := range s.Status() {
		if len(ps.Types) == 0 {
			continue
		}
		md := map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ps.Namespace)}
		if ps.Cluster != "" {
			md["CLUSTER_ID"] = structpb.NewStringValue(ps.Cluster)
		}
		if ps.Version != "" {
			md["ISTIO_VERSION"] = structpb.NewStringValue(ps.Version)
		}
		cc := &statusv3.ClientConfig{Node: &corev3.Node{Id: ps.ProxyID, Metadata: &structpb.Struct{Fields: md}}}
		for _, ts := range ps.Types {
			g := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: ts.TypeURL, ConfigStatus: configStatus[ts.Status], VersionInfo: ts.NonceAcked}
			if !ts.LastAcked.IsZero() {
				g.LastUpdated = timestamppb.New(ts.LastAcked)
			}
			cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, g)
		}
		out = append(out, cc)
	}
	return out
}

// mustAny wraps a message the server built; those always marshal.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err))
	}
	return a
}

// controlPlane identifies this instance in debug responses; istioctl shows
// its ID in the ISTIOD column.
func (s *Server) controlPlane() *corev3.ControlPlane {
	id, _ := json.Marshal(struct {
		Component string         `json:"Component"`
		ID        string         `json:"ID"`
		Info      map[string]any `json:"Info"`
	}{"canopy-controller", s.cfg.ID, map[string]any{"version": version.Get()}})
	return &corev3.ControlPlane{Identifier: string(id)}
}

// debugAllowed: proxy status names every proxy of the mesh, so only
// callers from the system namespace may read it.
func (s *Server) debugAllowed(c authn.Caller) error {
	if c.Namespace != s.cfg.SystemNamespace {
		return s.streamError("debug", codes.PermissionDenied,
			"proxy status is for callers in namespace %q, not %q", s.cfg.SystemNamespace, c.Namespace)
	}
	return nil
}

// ackOfOwn reports whether a debug request's response nonce is one this
// stream sent (its nonces count 1, 2, ... up to sent): the ACK of an
// answer. That is the one debug request left unanswered, since older
// istioctl releases ACK debug answers and answering the ACK would
// ping-pong until the stream ends. Any other request is answered whatever
// its nonce, as istiod does: istioctl sets a fresh nonce (the time) on
// every request, its first included.
func ackOfOwn(nonce string, sent uint64) bool {
	n, err := strconv.ParseUint(nonce, 10, 64)
	return err == nil && n >= 1 && n <= sent && strconv.FormatUint(n, 10) == nonce
}

func (s *Server) handleDebugDelta(c *conn, req *discoveryv3.DeltaDiscoveryRequest) error {
	if req.GetTypeUrl() != SynczTypeURL {
		return s.streamError("type", codes.InvalidArgument, "unsupported debug type %q (only %s)", req.GetTypeUrl(), SynczTypeURL)
	}
	c.mu.Lock()
	ack := ackOfOwn(req.GetResponseNonce(), c.nonce)
	c.mu.Unlock()
	if ack {
		return nil
	}
	if err := s.debugAllowed(c.caller); err != nil {
		return err
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: SynczTypeURL, ControlPlane: s.controlPlane()}
	for _, cc := range s.clientConfigs() {
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: cc.GetNode().GetId(), Resource: mustAny(cc)})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.debug) >= maxQueuedDebug {
		return s.streamError("limit", codes.ResourceExhausted, "more than %d debug requests waiting", maxQueuedDebug)
	}
	c.debug = append(c.debug, resp)
	c.signal()
	return nil
}

// StreamAggregatedResources serves Envoy types to sidecars and proxyless
// gRPC clients over state-of-the-world ADS (envoy_sotw.go), and answers
// debug queries the way istioctl proxy-status asks. Workload types are
// served over Delta ADS only.
func (s *Server) StreamAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	caller, err := s.authenticate(stream.Context())
	if err != nil {
		return err
	}
	release, err := s.admit(stream.Context(), caller)
	if err != nil {
		return err
	}
	defer release()
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	proxy, err := s.open(caller, req.GetNode())
	if err != nil {
		return err
	}
	if envoy, err := s.envoyStream(proxy, req.GetTypeUrl()); err != nil {
		return err
	} else if envoy {
		return s.serveEnvoy(stream, caller, proxy, req)
	}
	var nonce uint64
	for {
		switch typ := req.GetTypeUrl(); {
		case typ == SynczTypeURL:
			if ackOfOwn(req.GetResponseNonce(), nonce) {
				break
			}
			if err := s.debugAllowed(caller); err != nil {
				return err
			}
			nonce++
			resp := &discoveryv3.DiscoveryResponse{
				TypeUrl: SynczTypeURL, VersionInfo: strconv.FormatUint(s.gen.Load(), 10),
				Nonce: strconv.FormatUint(nonce, 10), ControlPlane: s.controlPlane(),
			}
			for _, cc := range s.clientConfigs() {
				resp.Resources = append(resp.Resources, mustAny(cc))
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
		case strings.HasPrefix(typ, debugPrefix):
			return s.streamError("type", codes.InvalidArgument, "unsupported debug type %q (only %s)", typ, SynczTypeURL)
		default:
			if isEnvoyType(typ) {
				return s.streamError("type", codes.Unimplemented,
					"type %q on a debug stream: a stream is served Envoy types when its first request asks for one", typ)
			}
			return s.streamError("type", codes.Unimplemented,
				"type %q over state-of-the-world ADS: workload types are served over Delta ADS only", typ)
		}
		if req, err = stream.Recv(); err != nil {
			return nil
		}
	}
}
