package xds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/internal/ratewait"
)

// admission decides whether an authenticated caller may open a stream:
// caps on the streams open in total and per caller, and a budget of new
// streams per second (a new stream costs a whole table's response). Its
// names bound what the caller's streams may subscribe to.
// It is safe for concurrent use.
type admission struct {
	names *nameBudget

	maxTotal, maxPerCaller int
	// limiter is nil without a budget; wait is the longest a stream waits
	// for it before it is refused.
	limiter *rate.Limiter
	wait    time.Duration
	now     func() time.Time

	mu        sync.Mutex
	total     int
	perCaller map[string]int
}

func newAdmission(c Config) *admission {
	a := &admission{maxTotal: c.MaxStreams, maxPerCaller: c.MaxStreamsPerCaller, wait: max(c.StreamWait, 0), now: c.Now, perCaller: map[string]int{},
		names: &nameBudget{max: c.MaxNameBytesPerCaller, held: map[string]int64{}}}
	if c.StreamsPerSecond > 0 {
		a.limiter = rate.NewLimiter(rate.Limit(c.StreamsPerSecond), c.StreamBurst)
	}
	return a
}

// callerKey names a caller for the per-caller cap: its pod when the token
// is bound to one, else its service account.
func callerKey(c authn.Caller) string {
	k := c.Cluster + "/" + c.Namespace + "/" + c.ServiceAccount
	if c.PodUID != "" {
		k += "/" + c.PodUID
	}
	return k
}

// refusal is why a stream was not admitted: a metric reason and a status
// message.
type refusal struct {
	reason, msg string
}

// take counts a stream of caller in, or says why it may not open. release
// must be called once the admitted stream ends.
func (a *admission) take(caller authn.Caller) (release func(), r *refusal) {
	k := callerKey(caller)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.maxTotal > 0 && a.total >= a.maxTotal {
		return nil, &refusal{"total_streams", fmt.Sprintf("%d streams open, the server's limit", a.total)}
	}
	if a.maxPerCaller > 0 && a.perCaller[k] >= a.maxPerCaller {
		return nil, &refusal{"caller_streams", fmt.Sprintf("%d streams open for caller %s/%s, the limit per caller", a.perCaller[k], caller.Namespace, caller.ServiceAccount)}
	}
	a.total++
	a.perCaller[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.total--
			if a.perCaller[k]--; a.perCaller[k] <= 0 {
				delete(a.perCaller, k)
			}
		})
	}, nil
}

// pace waits for the new-stream budget, at most the configured wait.
func (a *admission) pace(ctx context.Context) *refusal {
	if a.limiter == nil {
		return nil
	}
	err := ratewait.Take(ctx, a.limiter, a.wait, a.now)
	if errors.Is(err, ratewait.ErrTooLong) {
		return &refusal{"stream_rate", "new-stream rate limit exceeded; retry later"}
	}
	if err != nil {
		return &refusal{"stream_rate", "stream ended while waiting for the new-stream rate limit"}
	}
	return nil
}

// admit takes a place for an authenticated caller's stream and waits for
// the new-stream budget. A refusal ends the stream with ResourceExhausted
// and is counted by reason.
func (s *Server) admit(ctx context.Context, caller authn.Caller) (func(), error) {
	release, r := s.admission.take(caller)
	if r == nil {
		if r = s.admission.pace(ctx); r != nil {
			release()
		}
	}
	if r != nil {
		s.log.Debug("stream refused", "reason", r.reason, "namespace", caller.Namespace, "service_account", caller.ServiceAccount)
		return nil, s.streamError(r.reason, codes.ResourceExhausted, "%s", r.msg)
	}
	return release, nil
}

// nameOverhead is what a subscribed name is charged besides its bytes:
// its entries in its watch's maps (the names asked for, those to answer,
// those held). A made-up name of 57 bytes held took about 125 bytes of
// heap in all (TestMadeUpNamesCostOnlyTheirCaller); the rest leaves room
// for a map's growth and a Delta watch's answers, so that the bound is
// one on memory.
const nameOverhead = 128

// nameCost is what one subscribed name is charged.
func nameCost(name string) int64 { return int64(len(name)) + nameOverhead }

// nameBudget bounds the names one caller's streams hold subscribed, over
// all of them and every type, in bytes (nameCost each). A name costs the
// server a little memory whether or not anything has it (what the mesh
// has is shared, what it has not is never held), so the bound is what
// keeps one caller that makes names up, on the most streams it may
// open, from pinning more than that. It is safe for concurrent use.
type nameBudget struct {
	// max is the bound per caller; <= 0: none.
	max int64

	mu    sync.Mutex
	held  map[string]int64
	total int64
}

// charge adds delta bytes (negative: returns them) to what caller holds
// and reports what it then holds; ok is false, and nothing is charged,
// when an increase would take it past the bound.
func (b *nameBudget) charge(caller string, delta int64) (held int64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	held = b.held[caller] + delta
	if delta > 0 && b.max > 0 && held > b.max {
		return held - delta, false
	}
	b.total += delta
	if held <= 0 {
		delete(b.held, caller)
		return 0, true
	}
	b.held[caller] = held
	return held, true
}

// Total is what every caller holds.
func (b *nameBudget) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// chargedNames is a watch's subscribed names as charged to its stream's caller.
// The stream's goroutine alone changes it.
type chargedNames struct {
	// cost is what the names cost now (nameCost each); charged what the
	// caller has been charged for them.
	cost, charged int64
}

// settleNames charges caller for what n's names cost now: an error ends the
// stream when that takes the caller past its bound (counted as
// caller_names). what names the names in the error.
func (s *Server) settleNames(n *chargedNames, caller authn.Caller, what string) error {
	delta := n.cost - n.charged
	if delta == 0 {
		return nil
	}
	held, ok := s.admission.names.charge(callerKey(caller), delta)
	if !ok {
		return s.streamError("caller_names", codes.ResourceExhausted,
			"%s: %d more bytes of subscribed names; caller %s/%s holds %d over its streams, limit %d per caller",
			what, delta, caller.Namespace, caller.ServiceAccount, held, s.admission.names.max)
	}
	n.charged = n.cost
	return nil
}

// releaseNames returns what n's names were charged, when its watch or
// stream ends.
func (s *Server) releaseNames(n *chargedNames, caller authn.Caller) {
	if n.charged != 0 {
		s.admission.names.charge(callerKey(caller), -n.charged)
		n.charged = 0
	}
}
