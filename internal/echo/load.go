package echo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Bounds of a load run: a caller of the test app cannot make it hold more
// than this.
const (
	maxLoadDuration = 10 * time.Minute
	maxHeld         = 100
	minInterval     = time.Millisecond
	// maxErrors is how many distinct error texts a report keeps.
	maxErrors     = 10
	loadIOTimeout = 5 * time.Second
)

// LoadConfig is one load run against a TCP echo server: a new connection
// every Interval for Duration, each sending a message and reading its echo,
// and Held long-lived connections that echo a message every HeldEvery until
// the end, each replaced when it fails.
type LoadConfig struct {
	Addr      string
	Duration  time.Duration
	Interval  time.Duration
	Held      int
	HeldEvery time.Duration
}

// Validate refuses a run the app will not make.
func (c LoadConfig) Validate() error {
	switch {
	case c.Addr == "":
		return errors.New("no address")
	case c.Duration <= 0 || c.Duration > maxLoadDuration:
		return fmt.Errorf("duration %s: want more than 0, at most %s", c.Duration, maxLoadDuration)
	case c.Interval < minInterval:
		return fmt.Errorf("interval %s: want at least %s", c.Interval, minInterval)
	case c.Held < 0 || c.Held > maxHeld:
		return fmt.Errorf("held %d: want 0 to %d", c.Held, maxHeld)
	case c.Held > 0 && c.HeldEvery < minInterval:
		return fmt.Errorf("held-every %s: want at least %s", c.HeldEvery, minInterval)
	}
	return nil
}

// LoadReport is what a run saw. A failure is classified by what the
// kernel said: refused (nothing accepted the connection), reset (an
// accepted connection was torn down), timeout, eof (closed before the echo
// came back) or other.
type LoadReport struct {
	Connections int            `json:"connections"`
	Failures    int            `json:"failures"`
	ByKind      map[string]int `json:"byKind,omitempty"`
	// LongestStall is the longest time without a new connection
	// completing its echo, from the start to the end of the run.
	LongestStall time.Duration `json:"longestStall"`
	// Held counts the long-lived connections opened (one per held slot,
	// and one more after each failure); HeldFailures those that failed
	// before the end, HeldEchoes their echoes in all.
	Held         int      `json:"held"`
	HeldFailures int      `json:"heldFailures"`
	HeldEchoes   int      `json:"heldEchoes"`
	Errors       []string `json:"errors,omitempty"`
	// Start is when the run began; FailuresAt counts the failures of new
	// connections by the second of the run they happened in, to line them
	// up with what else happened then (a component's roll, its logs).
	Start      time.Time   `json:"start"`
	FailuresAt map[int]int `json:"failuresAt,omitempty"`
	// HeldFailuresAt is the same for the long-lived connections.
	HeldFailuresAt map[int]int `json:"heldFailuresAt,omitempty"`
}

// loadRun accumulates a report from the run's goroutines.
type loadRun struct {
	mu sync.Mutex
	r  LoadReport
}

func (l *loadRun) fail(err error, held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if held {
		l.r.HeldFailures++
	} else {
		l.r.Failures++
	}
	kind := failureKind(err)
	if l.r.ByKind == nil {
		l.r.ByKind = map[string]int{}
	}
	l.r.ByKind[kind]++
	msg := err.Error()
	for _, e := range l.r.Errors {
		if e == msg {
			return
		}
	}
	if len(l.r.Errors) < maxErrors {
		l.r.Errors = append(l.r.Errors, msg)
	}
}

func (l *loadRun) failedAt(second int, held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := &l.r.FailuresAt
	if held {
		at = &l.r.HeldFailuresAt
	}
	if *at == nil {
		*at = map[int]int{}
	}
	(*at)[second]++
}

func failureKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "other"
}

// RunLoad makes the run and reports it; ctx ends it early.
func RunLoad(ctx context.Context, d Dialer, cfg LoadConfig) (LoadReport, error) {
	if err := cfg.Validate(); err != nil {
		return LoadReport{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	run := &loadRun{}
	var wg sync.WaitGroup
	start := time.Now()
	run.r.Start = start
	for i := range cfg.Held {
		wg.Go(func() { run.hold(ctx, d, cfg, i, start) })
	}
	last := start
	var stall time.Duration
	for ctx.Err() == nil {
		next := time.Now().Add(cfg.Interval)
		// Each connection gets the same bound whatever is left of the run:
		// a connection cut short by the run's end is not a failure.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), loadIOTimeout)
		_, err := EchoTCP(cctx, d, cfg.Addr, "load")
		ccancel()
		now := time.Now()
		run.mu.Lock()
		run.r.Connections++
		run.mu.Unlock()
		if err != nil {
			run.fail(err, false)
			run.failedAt(int(now.Sub(start)/time.Second), false)
		} else {
			stall = max(stall, now.Sub(last))
			last = now
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(next)):
		}
	}
	stall = max(stall, time.Since(last))
	wg.Wait()
	run.mu.Lock()
	defer run.mu.Unlock()
	run.r.LongestStall = stall.Round(time.Millisecond)
	return run.r, nil
}

// hold keeps one long-lived connection, echoing on it every HeldEvery
// until the run ends; a connection that fails is counted and replaced
// after a HeldEvery, so that a long run sees every cut, not only the
// first.
func (l *loadRun) hold(ctx context.Context, d Dialer, cfg LoadConfig, i int, start time.Time) {
	for ctx.Err() == nil {
		if err := l.holdOne(ctx, d, cfg, i); err != nil {
			l.fail(err, true)
			l.failedAt(int(time.Since(start)/time.Second), true)
		}
		select {
		case <-ctx.Done():
		case <-time.After(cfg.HeldEvery):
		}
	}
}

// holdOne is one long-lived connection, from its dial to its failure (the
// error) or the end of the run (nil).
func (l *loadRun) holdOne(ctx context.Context, d Dialer, cfg LoadConfig, i int) error {
	dctx, cancel := context.WithTimeout(ctx, loadIOTimeout)
	conn, err := d.DialContext(dctx, "tcp", cfg.Addr)
	cancel()
	if ctx.Err() != nil {
		return nil // the run ended during the dial
	}
	l.mu.Lock()
	l.r.Held++
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("held connection %d: dial: %w", i, err)
	}
	defer conn.Close()
	msg := []byte(fmt.Sprintf("held-%03d", i))
	buf := make([]byte, len(msg))
	t := time.NewTicker(cfg.HeldEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_ = conn.SetDeadline(time.Now().Add(loadIOTimeout))
		if _, err := conn.Write(msg); err != nil {
			return fmt.Errorf("held connection %d: write: %w", i, err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			return fmt.Errorf("held connection %d: read: %w", i, err)
		}
		l.mu.Lock()
		l.r.HeldEchoes++
		l.mu.Unlock()
	}
}
