package xds

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// DefaultSendBudget is the default of SendBudget's size: two to three whole
// Address tables of a 10,000-pod mesh, which keeps two cores busy
// encoding and writing (a larger budget sent 50 node proxies their tables
// no sooner, with more memory).
const DefaultSendBudget = 8 << 20

// minBudgeted is the encoded size from which a response is charged to the
// budget. Smaller ones (a push of a few changes) never wait behind a
// connecting proxy's whole table; they still carry the send deadline.
const minBudgeted = 32 << 10

// SendBudget bounds the bytes of workload responses that are encoded and
// not yet written to the proxies' connections, over all streams. A whole
// Address table is megabytes; when many node proxies connect at once
// (a controller restart, a node pool scaling up), each stream would
// otherwise hold its own encoded copy, queued in gRPC's transport until its
// proxy has read it, and the controller's memory would grow with the
// number of proxies connecting rather than with the mesh.
//
// A response that will carry a whole table takes its size (estimated from
// the table) before it is built, any other once built if it turned out
// large; one larger than the whole budget waits for all of it, and one
// caller's streams take at most a quarter (or one response larger than
// that). The share comes back once gRPC has written the response's last
// byte to the connection, or its stream ended.
// Knowing when that is takes the budget's codec on the gRPC server
// (Codec): it encodes the responses the budget knows into a buffer whose
// release by the transport returns the bytes. Without it, the bytes return
// as soon as Send does, and the budget bounds only the building.
//
// A response its proxy has not read within the send timeout ends the
// stream: a proxy that stops reading holds its share for that long at
// most.
type SendBudget struct {
	size int64
	sem  *semaphore.Weighted
	// A caller (callerKey) holds at most a quarter of the budget, so that
	// one caller's streams that do not read cannot hold all of it for
	// the send timeout.
	callerMu sync.Mutex
	callers  map[string]*callerShare
	// out are the responses taken from the budget and not yet encoded, by
	// message: the codec sees only the message.
	out   sync.Map // *discoveryv3.DeltaDiscoveryResponse → *hold
	used  atomic.Int64
	proto encoding.CodecV2
}

// NewSendBudget returns a budget of size bytes (DefaultSendBudget when
// size <= 0).
func NewSendBudget(size int64) *SendBudget {
	if size <= 0 {
		size = DefaultSendBudget
	}
	return &SendBudget{size: size, sem: semaphore.NewWeighted(size), callers: map[string]*callerShare{}, proto: encoding.GetCodecV2("proto")}
}

// callerShare is one caller's part of the budget, kept while one of its
// responses uses or waits for it.
type callerShare struct {
	sem   *semaphore.Weighted
	users int
}

func (b *SendBudget) perCaller() int64 { return max(b.size/4, 1) }

// share returns caller's part, counted as used until its release is called.
func (b *SendBudget) share(caller string) (*semaphore.Weighted, func()) {
	b.callerMu.Lock()
	defer b.callerMu.Unlock()
	c := b.callers[caller]
	if c == nil {
		c = &callerShare{sem: semaphore.NewWeighted(b.perCaller())}
		b.callers[caller] = c
	}
	c.users++
	return c.sem, func() {
		b.callerMu.Lock()
		defer b.callerMu.Unlock()
		if c.users--; c.users == 0 {
			delete(b.callers, caller)
		}
	}
}

// hold is one response's share of the budget, from reserve until gRPC has
// written it (or its stream ended).
type hold struct {
	b      *SendBudget
	caller string
	// charge is taken from the budget (at most all of it), callerCharge
	// from the caller's part (the charge, at most all of the part).
	charge, callerCharge int64
	callerSem            *semaphore.Weighted
	leaveShare           func()
	once                 sync.Once
	// deadline ends the stream if the response is not written in time.
	deadline *time.Timer
}

// release stops the deadline and returns the share; only the first
// return counts.
func (h *hold) release() {
	if h.deadline != nil {
		h.deadline.Stop()
	}
	h.returnShare()
}

// returnShare returns the share, once. The deadline's own function calls
// it rather than release: it may run before settle has stored the timer
// in h.deadline, and must not read that field.
func (h *hold) returnShare() {
	h.once.Do(func() {
		h.give(h.charge)
		if h.leaveShare != nil {
			h.leaveShare()
		}
	})
}

// reserve takes a share of estimate bytes for a response about to be
// built, so that what waits for the budget is not yet built: a whole
// table's response is megabytes before it is encoded. An estimate under
// minBudgeted takes nothing.
func (b *SendBudget) reserve(ctx context.Context, caller string, estimate int64) (*hold, error) {
	h := &hold{b: b, caller: caller}
	if estimate >= minBudgeted {
		if err := h.acquire(ctx, estimate); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// acquire takes n bytes (at most the whole budget), from the caller's
// part first (at most all of it): a caller at its part waits there, not in
// the budget's queue.
func (h *hold) acquire(ctx context.Context, n int64) error {
	n = min(n, h.b.size)
	part := min(n, h.b.perCaller())
	h.callerSem, h.leaveShare = h.b.share(h.caller)
	if err := h.callerSem.Acquire(ctx, part); err != nil {
		h.leaveShare()
		h.leaveShare = nil
		return fmt.Errorf("send budget: %w", err)
	}
	if err := h.b.sem.Acquire(ctx, n); err != nil {
		h.callerSem.Release(part)
		h.leaveShare()
		h.leaveShare = nil
		return fmt.Errorf("send budget: %w", err)
	}
	h.charge, h.callerCharge = n, part
	h.b.used.Add(n)
	return nil
}

// give returns n bytes of the charge.
func (h *hold) give(n int64) {
	if n <= 0 {
		return
	}
	h.charge -= n
	h.b.used.Add(-n)
	h.b.sem.Release(n)
	if part := min(h.charge, h.b.perCaller()); part < h.callerCharge {
		h.callerSem.Release(h.callerCharge - part)
		h.callerCharge = part
	}
}

// settle readies a built response for Send: one that was not reserved
// for and is large after all waits for its share now. msg must not change
// until it is sent. If it is not written within timeout, tooSlow runs (it
// ends the stream) and the share returns.
func (h *hold) settle(ctx context.Context, msg proto.Message, timeout time.Duration, tooSlow func()) error {
	// The codec's Marshal relies on this Size (UseCachedSize).
	n := int64(proto.Size(msg))
	switch {
	case h.charge == 0 && n >= minBudgeted:
		if err := h.acquire(ctx, n); err != nil {
			return err
		}
	case h.charge > 0 && n < h.charge:
		// Smaller than reserved (a reconnecting proxy already holds most
		// of the table): the rest is for others.
		keep := n
		if keep < minBudgeted {
			keep = 0
		}
		h.give(h.charge - keep)
	}
	h.deadline = time.AfterFunc(timeout, func() {
		// The stream ends now, and gRPC drops what it still queues for
		// it; the share does not wait for that.
		tooSlow()
		h.returnShare()
	})
	h.b.out.Store(msg, h)
	return nil
}

// Used returns the bytes currently taken from the budget.
func (b *SendBudget) Used() int64 { return b.used.Load() }

// sent is called once Send returned: a response the codec did not encode
// (Send failed first, or the server has another codec) is not in the
// transport, so its share returns now.
func (b *SendBudget) sent(msg proto.Message) {
	if v, ok := b.out.LoadAndDelete(msg); ok {
		v.(*hold).release()
	}
}

// Codec is the gRPC server codec (grpc.ForceServerCodecV2) that tells the
// budget when a response has been written. It encodes every message as
// gRPC's proto codec does; only the buffers of budgeted responses differ.
func (b *SendBudget) Codec() encoding.CodecV2 { return budgetCodec{b} }

type budgetCodec struct{ b *SendBudget }

func (c budgetCodec) Name() string { return c.b.proto.Name() }

func (c budgetCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.b.proto.Unmarshal(data, v)
}

func (c budgetCodec) Marshal(v any) (mem.BufferSlice, error) {
	msg, ok := v.(proto.Message)
	if !ok {
		return c.b.proto.Marshal(v)
	}
	held, ok := c.b.out.LoadAndDelete(msg)
	if !ok {
		return c.b.proto.Marshal(v)
	}
	h := held.(*hold)
	// settle sized msg, and nothing changes it before Send.
	size := proto.Size(msg)
	if mem.IsBelowBufferPoolingThreshold(size) {
		// gRPC gives no word when it has written a buffer this small.
		h.release()
		return c.b.proto.Marshal(v)
	}
	// Encoded responses are megabytes: their buffers are reused, as gRPC's
	// own codec does, rather than left to the garbage collector.
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], msg)
	if err != nil {
		pool.Put(buf)
		h.release()
		return nil, fmt.Errorf("marshal %T: %w", msg, err)
	}
	*buf = out
	// The transport frees the buffer when it has written the last byte
	// (or dropped the stream); that is when the share returns.
	return mem.BufferSlice{mem.NewBuffer(buf, releaser{h: h, pool: pool})}, nil
}

// releaser is the pool of one budgeted buffer: giving the buffer back
// returns the response's share of the budget, and the buffer to gRPC's pool.
type releaser struct {
	h    *hold
	pool mem.BufferPool
}

func (r releaser) Get(n int) *[]byte { return r.pool.Get(n) }

func (r releaser) Put(b *[]byte) {
	r.pool.Put(b)
	r.h.release()
}
