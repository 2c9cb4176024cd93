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
// streams per second (a new stream costs a whole table's response).
// It is safe for concurrent use.
type admission struct {
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
	a := &admission{maxTotal: c.MaxStreams, maxPerCaller: c.MaxStreamsPerCaller, wait: max(c.StreamWait, 0), now: c.Now, perCaller: map[string]int{}}
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
