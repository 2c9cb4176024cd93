package eventually

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records a failure and, like testing.T, ends the goroutine that
// failed.
type fakeTB struct {
	ctx    context.Context
	failed string
}

func (*fakeTB) Helper()                    {}
func (f *fakeTB) Context() context.Context { return f.ctx }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls Within on its own goroutine, as a test would, and returns the
// failure message ("" if it passed).
func run(ctx context.Context, timeout time.Duration, what string, f func() bool) string {
	tb := &fakeTB{ctx: ctx}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Within(tb, timeout, what, f)
	}()
	<-done
	return tb.failed
}

func TestWithin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		trueAfter int32 // calls of f that return false first; -1: never true
		timeout   time.Duration
		cancel    int32 // the test's context ends at this call of f; 0: never
		wantCalls func(int32) bool
		wantFail  string // substring; "" means pass
	}{
		{name: "true at once", trueAfter: 0, timeout: time.Minute, wantCalls: func(n int32) bool { return n == 1 }},
		{name: "true after polls", trueAfter: 3, timeout: time.Minute, wantCalls: func(n int32) bool { return n == 4 }},
		{name: "never true", trueAfter: -1, timeout: 30 * time.Millisecond, wantCalls: func(n int32) bool { return n > 1 }, wantFail: "pod enrolled: not true after 30ms"},
		{name: "test ended", trueAfter: -1, timeout: time.Minute, cancel: 2, wantCalls: func(n int32) bool { return n == 2 }, wantFail: "pod enrolled: test ended while waiting"},
		// A Cleanup function's wait: the context ended before it began.
		{name: "in a cleanup", trueAfter: 3, timeout: time.Minute, cancel: -1, wantCalls: func(n int32) bool { return n == 4 }},
		{name: "in a cleanup, never true", trueAfter: -1, timeout: 30 * time.Millisecond, cancel: -1, wantCalls: func(n int32) bool { return n > 1 }, wantFail: "pod enrolled: not true after 30ms"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancel < 0 {
				cancel()
			}
			var calls atomic.Int32
			got := run(ctx, tt.timeout, "pod enrolled", func() bool {
				n := calls.Add(1)
				if n == tt.cancel {
					cancel()
				}
				return tt.trueAfter >= 0 && n > tt.trueAfter
			})
			if tt.wantFail == "" && got != "" {
				t.Errorf("Within() failed with %q, want a pass", got)
			}
			if tt.wantFail != "" && !strings.Contains(got, tt.wantFail) {
				t.Errorf("Within() failure = %q, want it to contain %q", got, tt.wantFail)
			}
			if n := calls.Load(); !tt.wantCalls(n) {
				t.Errorf("f called %d times", n)
			}
		})
	}
}

// TestTrueChecksOnceMoreAtTheDeadline: a condition that turns true while
// Within waits out the deadline passes.
func TestTrueChecksOnceMoreAtTheDeadline(t *testing.T) {
	t.Parallel()
	start := time.Now()
	got := run(t.Context(), 20*time.Millisecond, "late", func() bool { return time.Since(start) >= 20*time.Millisecond })
	if got != "" {
		t.Errorf("Within() failed with %q, want a pass", got)
	}
}

func TestTrueWithATestingT(t *testing.T) {
	t.Parallel()
	var calls int
	True(t, "third call", func() bool { calls++; return calls == 3 })
}
