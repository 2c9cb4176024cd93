package ratewait

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestTake(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	l := rate.NewLimiter(rate.Every(time.Hour), 2)
	l.SetBurstAt(now, 2)
	ctx := context.Background()
	for i := range 2 {
		if err := Take(ctx, l, 0, clock); err != nil {
			t.Fatalf("event %d of the burst: %v", i, err)
		}
	}
	if err := Take(ctx, l, time.Second, clock); !errors.Is(err, ErrTooLong) {
		t.Fatalf("past the burst with an hour to wait: %v, want ErrTooLong", err)
	}
	// A refused event leaves the bucket as it was: an hour on, one more.
	now = now.Add(time.Hour)
	if err := Take(ctx, l, 0, clock); err != nil {
		t.Fatalf("after an hour: %v", err)
	}
	// A cancelled wait gives its reservation back.
	fast := rate.NewLimiter(rate.Every(50*time.Millisecond), 1)
	_ = Take(ctx, fast, 0, time.Now)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Take(cctx, fast, time.Second, time.Now); !errors.Is(err, context.Canceled) {
		t.Fatalf("with the context ended: %v, want context.Canceled", err)
	}
}
