// Package eventually is the one polling assertion of Canopy's tests: wait
// until a condition holds, or fail the test saying what never happened.
//
// Only tests import this package. Its functions must be called from the
// test's own goroutine, since failing ends it (t.Fatalf).
package eventually

import (
	"context"
	"time"
)

const (
	// DefaultTimeout is how long True waits: enough for an informer, a
	// watch or a reconnect on a loaded machine.
	DefaultTimeout = 10 * time.Second
	// firstInterval and maxInterval bound the wait between two polls: it
	// starts short, so that a condition that is nearly true costs the test
	// little, and doubles up to maxInterval, so that a slow condition
	// (an HTTP request, an API call) is not polled in a busy loop.
	firstInterval = 5 * time.Millisecond
	maxInterval   = 100 * time.Millisecond
)

// TB is the part of testing.TB that the assertions need.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Context() context.Context
}

// True polls f until it returns true and fails t with what if it has not
// within DefaultTimeout or once the test's context ends.
func True(t TB, what string, f func() bool) {
	t.Helper()
	Within(t, DefaultTimeout, what, f)
}

// Within is True with its own timeout, for conditions that need longer
// (a built binary starting, a proxy connecting through the API server).
//
// A test's context ends just before its Cleanup functions run, so a wait
// that starts with the context already ended is a cleanup's: it waits for
// its condition until the timeout instead of failing at the first poll.
func Within(t TB, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	ended := t.Context().Done()
	if t.Context().Err() != nil {
		ended = nil
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	interval := firstInterval
	for {
		if f() {
			return
		}
		poll := time.NewTimer(interval)
		select {
		case <-poll.C:
		case <-deadline.C:
			poll.Stop()
			// One last look: the condition may have become true while
			// the test waited for the deadline.
			if f() {
				return
			}
			t.Fatalf("%s: not true after %s", what, timeout)
			return
		case <-ended:
			poll.Stop()
			t.Fatalf("%s: test ended while waiting: %v", what, context.Cause(t.Context()))
			return
		}
		interval = min(2*interval, maxInterval)
	}
}
