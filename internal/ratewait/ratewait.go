// Package ratewait takes one event from a token bucket, waiting for it
// only as long as a caller may wait: past that the event is refused at
// once and the bucket left as it was, so a flood is turned away without
// queueing behind itself.
package ratewait

import (
	"context"
	"errors"
	"time"

	"golang.org/x/time/rate"
)

// ErrTooLong: the bucket cannot afford the event within the allowed wait.
var ErrTooLong = errors.New("rate limit exceeded")

// Take reserves one event of l at now() and waits for it, at most
// maxWait. It returns ErrTooLong without waiting when the wait would be
// longer, and ctx's error (the reservation given back) when ctx ends first.
func Take(ctx context.Context, l *rate.Limiter, maxWait time.Duration, now func() time.Time) error {
	at := now()
	r := l.ReserveN(at, 1)
	if !r.OK() {
		return ErrTooLong
	}
	delay := r.DelayFrom(at)
	if delay > maxWait {
		r.CancelAt(at)
		return ErrTooLong
	}
	if delay <= 0 {
		return nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.CancelAt(now())
		return ctx.Err()
	}
}
