package controlplane_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// clientStream is what the benchmark's xDS clients (sotwClient,
// deltaClient) share: the connection and the stream they own, the
// stream's end, and what arrived.
type clientStream struct {
	name   string
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	// ended is closed, with err set, when the stream ends.
	ended chan struct{}

	// mu guards these and the embedding client's own state.
	mu       sync.Mutex
	err      error
	nack     error // the NACK the client sent, if any
	received map[string]traffic
}

// open sets the client up on conn and returns the context of its stream:
// headers md, ended by close.
func (c *clientStream) open(ctx context.Context, name string, conn *grpc.ClientConn, md metadata.MD) context.Context {
	ctx, c.cancel = context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	c.name, c.conn, c.ended, c.received = name, conn, make(chan struct{}), map[string]traffic{}
	return ctx
}

// serve runs run, the stream's receive loop, until it returns why the
// stream ended.
func (c *clientStream) serve(run func() error) {
	go func() {
		err := run()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.ended)
	}()
}

// count adds a response of typ to what arrived; callers hold mu.
func (c *clientStream) count(typ string, resp proto.Message, resources int) {
	tr := c.received[typ]
	tr.Responses++
	tr.Resources += resources
	tr.Bytes += proto.Size(resp)
	c.received[typ] = tr
}

// await waits for the time at delivers, the stream's end or ctx's.
func (c *clientStream) await(ctx context.Context, at <-chan time.Time) (time.Time, error) {
	select {
	case t := <-at:
		return t, nil
	case <-c.ended:
		return time.Time{}, c.failure()
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%s: expected response not received: %w", c.name, ctx.Err())
	}
}

// traffic returns what the client has received so far, by type.
func (c *clientStream) traffic() map[string]traffic {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.received)
}

// failure is the NACK the client sent, or why the stream ended.
func (c *clientStream) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cmp.Or(c.nack, c.err, errors.New(c.name+": stream ended"))
}

// close ends the stream and the connection.
func (c *clientStream) close() {
	c.cancel()
	c.conn.Close()
}
