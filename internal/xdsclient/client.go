// Package xdsclient is a Delta ADS client for the workload types
// (docs/wire-contract.md §2): wildcard or on-demand Address, wildcard
// Authorization, ACK/NACK with the nonce, and reconnects with backoff that
// send what is held as initial_resource_versions. Responses go to a Handler
// (a workloadtable applies them). The node proxy (cmd/canopy-node) and the
// xDS server's tests (controller/xds, cmd/canopy-controller) use it;
// canopyctl does not speak xDS, it reads the node proxies' /config_dump.
package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Handler applies one response; the rejected resources are NACKed.
type Handler interface {
	Apply(typeURL string, resources []*discoveryv3.Resource, removed []string) []workloadtable.Rejection
}

// Config configures a Client.
type Config struct {
	// Conn is the connection to the control plane (TLS or not, as the
	// caller dialed it).
	Conn grpc.ClientConnInterface
	// Node is sent on each type's first request of a stream.
	Node *corev3.Node
	// Token returns the bearer token for a stream; nil sends none.
	Token func(context.Context) (string, error)
	// ClusterID is sent as the clusterid header when set.
	ClusterID string
	// OnDemand subscribes to no Address until looked up (wire contract §2.3);
	// Authorization is always wildcard.
	OnDemand bool
	Handler  Handler
	// InitialBackoff and MaxBackoff bound reconnect delays (defaults 100ms
	// and 15s, with jitter).
	InitialBackoff, MaxBackoff time.Duration
	// MaxMessageSize is the largest response accepted (default 200 MiB,
	// as ztunnel).
	MaxMessageSize int
	// OnACK, if set, is called after every response is applied and
	// acknowledged (rejected is empty for an ACK).
	OnACK func(typeURL string, nonce string, rejected []workloadtable.Rejection)
	Log   *slog.Logger
}

// Client keeps one Delta ADS stream open.
type Client struct {
	cfg   Config
	ready chan struct{}

	mu sync.Mutex
	// versions is what is held, per type, for initial_resource_versions.
	versions map[string]map[string]string
	// lookups are on-demand keys waiting for an answer.
	lookups map[string][]chan bool
	// stream is the current stream's sender, nil between streams.
	send func(*discoveryv3.DeltaDiscoveryRequest) error
	// acked records the types acknowledged at least once.
	acked map[string]bool
}

// New returns a Client; Run drives it.
func New(cfg Config) (*Client, error) {
	if cfg.Conn == nil || cfg.Node == nil || cfg.Handler == nil {
		return nil, errors.New("xdsclient: Conn, Node and Handler are required")
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.InitialBackoff {
		cfg.MaxBackoff = max(15*time.Second, cfg.InitialBackoff)
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 200 << 20
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg:      cfg,
		ready:    make(chan struct{}),
		versions: map[string]map[string]string{workloadapi.AddressTypeURL: {}, workloadapi.AuthorizationTypeURL: {}},
		lookups:  map[string][]chan bool{},
		acked:    map[string]bool{},
	}, nil
}

// Ready is closed once a response of each type has been acknowledged, which
// is when ztunnel reports itself ready (wire contract §2.3).
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Run keeps a stream open until ctx ends, reconnecting with backoff.
func (c *Client) Run(ctx context.Context) error {
	backoff := c.cfg.InitialBackoff
	for {
		received, err := c.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			backoff = c.cfg.InitialBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		c.cfg.Log.Warn("xDS stream ended; reconnecting", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

// stream runs one stream; received reports whether any response arrived.
func (c *Client) stream(ctx context.Context) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var md []string
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token(ctx)
		if err != nil {
			return false, fmt.Errorf("token: %w", err)
		}
		md = append(md, "authorization", "Bearer "+tok)
	}
	if c.cfg.ClusterID != "" {
		md = append(md, "clusterid", c.cfg.ClusterID)
	}
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(c.cfg.Conn).DeltaAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(c.cfg.MaxMessageSize))
	if err != nil {
		return false, err
	}
	var sendMu sync.Mutex
	send := func(r *discoveryv3.DeltaDiscoveryRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(r)
	}
	// The first requests go out before any other: a Lookup that finds the
	// new sender waits on sendMu until they are sent, else its subscribe
	// could open the stream without the node and the server would end it.
	sendMu.Lock()
	c.mu.Lock()
	first := c.initialRequests()
	c.send = send
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.send = nil
		c.mu.Unlock()
	}()
	for _, r := range first {
		if err := st.Send(r); err != nil {
			sendMu.Unlock()
			return false, err
		}
	}
	sendMu.Unlock()
	for {
		resp, err := st.Recv()
		if err != nil {
			return received, err
		}
		received = true
		ack, rejected := c.apply(resp)
		if err := send(ack); err != nil {
			return received, err
		}
		c.acknowledged(resp.GetTypeUrl(), resp.GetNonce(), rejected)
	}
}

// initialRequests are a stream's first request per type: Address first, then
// Authorization (wire contract §2.3), each with the node and what is held.
func (c *Client) initialRequests() []*discoveryv3.DeltaDiscoveryRequest {
	addr := &discoveryv3.DeltaDiscoveryRequest{
		Node: c.cfg.Node, TypeUrl: workloadapi.AddressTypeURL,
		InitialResourceVersions: copyMap(c.versions[workloadapi.AddressTypeURL]),
	}
	if c.cfg.OnDemand {
		addr.ResourceNamesSubscribe = []string{"*"}
		addr.ResourceNamesUnsubscribe = []string{"*"}
		// Lookups still waiting are sent with an empty version.
		for key := range c.lookups {
			if _, held := addr.InitialResourceVersions[key]; !held {
				addr.InitialResourceVersions[key] = ""
			}
		}
	}
	authz := &discoveryv3.DeltaDiscoveryRequest{
		Node: c.cfg.Node, TypeUrl: workloadapi.AuthorizationTypeURL,
		InitialResourceVersions: copyMap(c.versions[workloadapi.AuthorizationTypeURL]),
	}
	return []*discoveryv3.DeltaDiscoveryRequest{addr, authz}
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// apply hands a response to the handler and returns its ACK or NACK.
func (c *Client) apply(resp *discoveryv3.DeltaDiscoveryResponse) (*discoveryv3.DeltaDiscoveryRequest, []workloadtable.Rejection) {
	typ := resp.GetTypeUrl()
	rejected := c.cfg.Handler.Apply(typ, resp.GetResources(), resp.GetRemovedResources())
	bad := make(map[string]bool, len(rejected))
	for _, r := range rejected {
		bad[r.Name] = true
	}
	c.mu.Lock()
	versions := c.versions[typ]
	if versions == nil {
		versions = map[string]string{}
		c.versions[typ] = versions
	}
	var done []chan bool
	var found []bool
	complete := func(key string, ok bool) {
		for _, ch := range c.lookups[key] {
			done = append(done, ch)
			found = append(found, ok)
		}
		delete(c.lookups, key)
	}
	for _, r := range resp.GetResources() {
		if bad[r.GetName()] {
			continue
		}
		versions[r.GetName()] = r.GetVersion()
		// A lookup completes on the exact name or, unlike ztunnel, on any
		// alias (wire contract §2.4 gotcha).
		complete(r.GetName(), true)
		for _, a := range r.GetAliases() {
			complete(a, true)
		}
	}
	for _, name := range resp.GetRemovedResources() {
		delete(versions, name)
		complete(name, false)
	}
	c.mu.Unlock()
	for i, ch := range done {
		ch <- found[i]
	}
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.GetNonce()}
	if len(rejected) > 0 {
		req.ErrorDetail = &status.Status{Code: 3, Message: workloadtable.JoinRejections(rejected)} // INVALID_ARGUMENT
		c.cfg.Log.Warn("rejected xDS resources", "type", typ, "error", req.ErrorDetail.Message)
	}
	return req, rejected
}

// acknowledged records a sent ACK or NACK.
func (c *Client) acknowledged(typ, nonce string, rejected []workloadtable.Rejection) {
	c.mu.Lock()
	c.acked[typ] = true
	if c.acked[workloadapi.AddressTypeURL] && c.acked[workloadapi.AuthorizationTypeURL] {
		select {
		case <-c.ready:
		default:
			close(c.ready)
		}
	}
	c.mu.Unlock()
	if c.cfg.OnACK != nil {
		c.cfg.OnACK(typ, nonce, rejected)
	}
}

// Lookup subscribes on demand to key ("<network>/<ip>", a workload UID or
// "<namespace>/<hostname>") and waits for the answer: found is false when
// the control plane says it does not exist. While no stream is open the
// key is sent on the next one.
func (c *Client) Lookup(ctx context.Context, key string) (found bool, err error) {
	ch := make(chan bool, 1)
	c.mu.Lock()
	c.lookups[key] = append(c.lookups[key], ch)
	send := c.send
	c.mu.Unlock()
	if send != nil {
		// A failed send ends the stream; the next one carries the key.
		_ = send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: workloadapi.AddressTypeURL, ResourceNamesSubscribe: []string{key}})
	}
	select {
	case found := <-ch:
		return found, nil
	case <-ctx.Done():
		c.mu.Lock()
		c.lookups[key] = deleteChan(c.lookups[key], ch)
		if len(c.lookups[key]) == 0 {
			delete(c.lookups, key)
		}
		c.mu.Unlock()
		return false, ctx.Err()
	}
}

func deleteChan(chs []chan bool, ch chan bool) []chan bool {
	out := chs[:0]
	for _, c := range chs {
		if c != ch {
			out = append(out, c)
		}
	}
	return out
}

// Versions returns the resource versions held of a type.
func (c *Client) Versions(typeURL string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return copyMap(c.versions[typeURL])
}
