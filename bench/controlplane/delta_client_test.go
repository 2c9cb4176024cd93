package controlplane_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// The workload types a ztunnel node proxy subscribes to, in the order it
// asks for them.
const (
	addressType       = workloadapi.AddressTypeURL
	authorizationType = workloadapi.AuthorizationTypeURL
)

// workloadTypes lists them in that order.
var workloadTypes = [...]string{addressType, authorizationType}

// watchedPod is a pod whose workload a Delta client keeps decoded, for
// expectations on its status.
type watchedPod struct{ namespace, name string }

// deltaClient is a Delta ADS stream that subscribes as ztunnel does: a
// wildcard of each workload type (an empty subscribe list), the node on
// each type's first request, every response ACKed. It holds the names
// of what it was sent, by type, and decodes only the Address resources
// that may be the workload of its watched pod (their bytes hold its
// name), so that 50 clients of a table of 11,000 addresses cost the
// machine little besides the controllers. Its methods are safe for
// concurrent use.
type deltaClient struct {
	clientStream
	watch watchedPod
	// answered is closed once a response of each type has been ACKed,
	// the point at which ztunnel reports itself ready.
	answered chan struct{}

	// Guarded by mu:
	held    map[string]map[string]bool // type → names held
	answers map[string]int             // type → responses received
	grew    time.Time                  // the arrival of the last Address response that added a name
	ready   *bool                      // the watched pod's workload status, nil while not held
	// watchedName is the name of the watched pod's workload resource.
	watchedName string
	expects     []*readyExpectation
}

// readyExpectation waits for the watched pod's workload to be held as
// ready (status HEALTHY) or not (UNHEALTHY, or not held).
type readyExpectation struct {
	ready bool
	at    chan time.Time
}

// dialDelta opens a client's stream on conn with headers md and asks for
// both workload types as wildcards. The client owns conn and closes it in
// close.
func dialDelta(ctx context.Context, name string, conn *grpc.ClientConn, md metadata.MD, node *corev3.Node, watch watchedPod) (*deltaClient, error) {
	c := &deltaClient{watch: watch, answered: make(chan struct{}), held: map[string]map[string]bool{}, answers: map[string]int{}}
	ctx = c.open(ctx, name, conn, md)
	for _, typ := range workloadTypes {
		c.held[typ] = map[string]bool{}
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxResponse))
	if err != nil {
		c.close()
		return nil, fmt.Errorf("open stream of %s: %w", name, err)
	}
	for _, typ := range workloadTypes {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typ}); err != nil {
			c.close()
			return nil, fmt.Errorf("ask %s for %s: %w", name, shortType(typ), err)
		}
	}
	c.serve(func() error { return c.run(stream) })
	return c, nil
}

func (c *deltaClient) run(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("stream of %s: %w", c.name, err)
		}
		both := c.apply(resp, time.Now())
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			return fmt.Errorf("ACK of %s: %w", c.name, err)
		}
		if both {
			close(c.answered)
		}
	}
}

// apply keeps a response that arrived at at; it reports whether it is
// the one after which each type has been answered once.
func (c *deltaClient) apply(resp *discoveryv3.DeltaDiscoveryResponse, at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	typ := resp.GetTypeUrl()
	held, ok := c.held[typ]
	if !ok {
		return false
	}
	c.count(typ, resp, len(resp.GetResources()))
	c.answers[typ]++
	added := false
	for _, name := range resp.GetRemovedResources() {
		delete(held, name)
		if typ == addressType && name == c.watchedName {
			c.ready, c.watchedName = nil, ""
		}
	}
	for _, r := range resp.GetResources() {
		if !held[r.GetName()] {
			held[r.GetName()] = true
			added = true
		}
		if typ == addressType && c.observe(r.GetResource().GetValue()) {
			c.watchedName = r.GetName()
		}
	}
	both := c.answers[addressType] > 0 && c.answers[authorizationType] > 0 && c.answers[typ] == 1
	if typ != addressType {
		return both
	}
	if added {
		c.grew = at
	}
	c.expects = slices.DeleteFunc(c.expects, func(e *readyExpectation) bool {
		if (c.ready != nil && *c.ready) != e.ready {
			return false
		}
		e.at <- at
		return true
	})
	return both
}

// observe decodes an Address resource that may be the watched pod's
// workload and, if it is, keeps its status and reports true.
func (c *deltaClient) observe(b []byte) bool {
	if c.watch.name == "" || !bytes.Contains(b, []byte(c.watch.name)) {
		return false
	}
	var a workloadapi.Address
	if proto.Unmarshal(b, &a) != nil {
		return false
	}
	w := a.GetWorkload()
	if w.GetName() != c.watch.name || w.GetNamespace() != c.watch.namespace {
		return false
	}
	ready := w.GetStatus() == workloadapi.WorkloadStatus_HEALTHY
	c.ready = &ready
	return true
}

// waitAnswered blocks until the client has ACKed a response of each type.
func (c *deltaClient) waitAnswered(ctx context.Context) error {
	select {
	case <-c.answered:
		return nil
	case <-c.ended:
		return c.failure()
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("%s: not answered (responses %v): %w", c.name, c.answers, ctx.Err())
	}
}

// expectReady registers an expectation that a coming response holds the
// watched pod's workload as ready (or not); the channel receives that
// response's arrival. It is an error for it to hold already.
func (c *deltaClient) expectReady(ready bool) (<-chan time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (c.ready != nil && *c.ready) == ready {
		return nil, fmt.Errorf("%s: workload %s/%s already ready=%t", c.name, c.watch.namespace, c.watch.name, ready)
	}
	e := &readyExpectation{ready: ready, at: make(chan time.Time, 1)}
	c.expects = append(c.expects, e)
	return e.at, nil
}

// state returns how many names of each type the client holds, how many
// responses of each it received, and when the Address table last grew.
func (c *deltaClient) state() (held, answers map[string]int, grew time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	held = map[string]int{}
	for typ, names := range c.held {
		held[typ] = len(names)
	}
	return held, maps.Clone(c.answers), c.grew
}

// heldNames returns the names of typ the client holds for which match
// is true.
func (c *deltaClient) heldNames(typ string, match func(string) bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name := range c.held[typ] {
		if match(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// heldReady reports the watched pod's workload status: nil while not
// held.
func (c *deltaClient) heldReady() *bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}
