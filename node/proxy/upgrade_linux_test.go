package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// TestUpgradeHandsOver is a node proxy upgrade as the chart rolls it
// (maxSurge 1): the old proxy serves two enrolled pods (their namespaces
// migrate queued connections, as the CNI agent sets them), long-lived
// connections run through it, a new proxy starts beside it with its own
// listeners in both pods, a client in the client pod opens new
// connections all the time through the capture path (15001, HBONE to
// 15008, the echo app), and the old proxy drains as canopy-node does on
// SIGTERM (Proxy.Drain). No new connection may be refused, reset or cut;
// the long-lived ones that end during the drain end normally on the old
// proxy, and those that outlive it are closed only when it is over,
// counted with the reason. The figures (connections, each proxy's share,
// the longest stall) are logged, not asserted on.
func TestUpgradeHandsOver(t *testing.T) {
	m := newMesh(t, "10.233.0.0/24")
	old, oldReg, oldPods := m.proxy, m.reg, m.pods
	target := m.pair.AddrB.String() + ":8080"

	// The drain period starts when the old proxy is told to stop; its
	// context exists now so that the long-lived connections can tell
	// whether it was over when they ended.
	const drainPeriod = 2 * time.Second
	dctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Before the upgrade every connection is the old proxy's.
	var long []*longConn
	for range 4 {
		long = append(long, dialLong(t, m.clientNS, target, dctx))
	}
	_, nextReg, _ := m.newProxy(t)

	l := startLoad(m.clientNS, target, 4)
	t.Cleanup(func() { l.stop() })
	// Both proxies' listeners take new connections (the kernel spreads
	// them over the SO_REUSEPORT group) before the old one stops.
	eventually.True(t, "both proxies carry new connections", func() bool {
		return opened(t, oldReg) >= float64(len(long))+100 && opened(t, nextReg) >= 100
	})

	// A burst of connections arrives as the old proxy stops: some wait
	// in its listeners' queues when they close.
	burst := l.burst(64)
	drainStart := time.Now()
	time.AfterFunc(drainPeriod, cancel)
	drained := make(chan Drained, 1)
	go func() { drained <- old.Drain(dctx) }()
	burst()

	// Two long-lived connections end during the drain: the old proxy
	// still carries them to their normal end.
	eventually.True(t, "the old proxy drains", func() bool {
		old.mu.Lock()
		defer old.mu.Unlock()
		return old.draining
	})
	for _, lc := range long[:2] {
		if err := lc.finish(); err != nil {
			t.Errorf("a long-lived connection ending during the drain: %v", err)
		}
		if dctx.Err() != nil {
			t.Fatal("the drain period was over before the long-lived connections ended: the test machine is too slow for this scenario")
		}
	}
	d := <-drained
	drainTook := time.Since(drainStart)
	// What canopy-node does next: the pods' namespaces are let go
	// (pods.Set.Close) and the pool closed.
	for _, pod := range oldPods {
		_ = pod.Close()
	}
	old.Close()

	// The others outlived the drain: closed at its end, never before.
	for i, lc := range long[2:] {
		end := lc.wait()
		if end.err == nil {
			t.Errorf("long-lived connection %d was not closed at the end of the drain", i+2)
		}
		if !end.afterDrain {
			t.Errorf("long-lived connection %d ended before the drain period was over: %v", i+2, end.err)
		}
	}
	cut := testutil.ToFloat64(old.metrics.cut.WithLabelValues(reasonDrainOver))
	if cut != float64(d.CutTotal()) || d.Cut[kindOutbound] != 2 {
		t.Errorf("cut %v (metric) / %v (by kind); want the 2 long-lived outbound connections (and the HBONE connection carrying them)", cut, d.Cut)
	}
	if d.NoMigration != 0 {
		t.Errorf("%d pods do not migrate queued connections; the agent's rules turn it on", d.NoMigration)
	}

	// The new proxy alone, for as many connections again.
	after := l.completed()
	eventually.True(t, "the new proxy carries connections alone", func() bool { return l.completed() >= after+100 })
	r := l.stop()

	t.Logf("drain: %d pods, %d connections open when the listeners closed, took %v of %v, cut %v",
		d.Pods, d.Open, drainTook.Round(time.Millisecond), drainPeriod, d.Cut)
	t.Logf("new connections: %d carried (old proxy %v, new proxy %v as source), failures %v; longest connection %v, longest gap between two completions %v",
		r.ok, opened(t, oldReg)-float64(len(long)), opened(t, nextReg), r.failures, r.longest.Round(time.Millisecond), r.gap.Round(time.Millisecond))
	if len(r.failures) > 0 {
		t.Errorf("new connections failed during the upgrade: %v (first: %v)", r.failures, r.first)
	}
}

// opened is how many connections a proxy carried as the source.
func opened(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "istio_tcp_connections_opened_total" {
			continue
		}
		for _, mc := range mf.GetMetric() {
			for _, lp := range mc.GetLabel() {
				if lp.GetName() == "reporter" && lp.GetValue() == "source" {
					n += mc.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// dialIn connects to addr from inside the netns at ns.
func dialIn(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

// longConn is a connection that exchanges a message every few
// milliseconds until finished or closed under it.
type longConn struct {
	c      net.Conn
	finish func() error
	ended  chan longEnd
}

// longEnd is how a longConn ended: err is nil for a normal end;
// afterDrain says whether the drain period was over by then.
type longEnd struct {
	err        error
	afterDrain bool
}

// wait returns how the connection ended; one still running after a
// generous bound (not a timing assertion: a bound on a hang) is reported
// as never ending.
func (lc *longConn) wait() longEnd {
	select {
	case e := <-lc.ended:
		return e
	case <-time.After(30 * time.Second):
		return longEnd{err: errors.New("still open 30s later")}
	}
}

// dialLong opens a long-lived connection and starts its exchanges. When
// it fails, drain tells whether the drain period was over: the proxy cuts
// only after its context ended, so a failure seen with drain.Err() nil
// was not the drain's doing at its end.
func dialLong(t *testing.T, ns, addr string, drain context.Context) *longConn {
	t.Helper()
	c, err := dialIn(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	lc := &longConn{c: c, ended: make(chan longEnd, 1)}
	stop := make(chan struct{})
	lc.finish = func() error {
		close(stop)
		return lc.wait().err
	}
	// A round trip: the same 8 bytes back.
	ping := func(i int) error {
		msg := fmt.Appendf(nil, "ping%04d", i%10000)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != string(msg) {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	}
	if err := ping(0); err != nil {
		t.Fatalf("first round trip: %v", err)
	}
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-stop:
				// A normal end: half-close, and the echo app's FIN back.
				_ = c.(*net.TCPConn).CloseWrite()
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				rest, err := io.ReadAll(c)
				if err == nil && len(rest) > 0 {
					err = fmt.Errorf("%d bytes after the half-close", len(rest))
				}
				lc.ended <- longEnd{err: err, afterDrain: drain.Err() != nil}
				return
			case <-tick.C:
			}
			if err := ping(i); err != nil {
				lc.ended <- longEnd{err: err, afterDrain: drain.Err() != nil}
				return
			}
		}
	}()
	return lc
}

// load opens connections from a pod all the time, each writing a message,
// half-closing and reading the echo to its end.
type load struct {
	ns, addr string
	stopc    chan struct{}
	wg       sync.WaitGroup

	mu       sync.Mutex
	ok       int
	ends     []time.Time
	longest  time.Duration
	failures map[string]int
	first    error
}

// loadResult is what a load saw.
type loadResult struct {
	ok       int
	failures map[string]int
	first    error
	// longest is the longest connection (dial to the echo's end); gap
	// the longest time no connection completed.
	longest, gap time.Duration
}

func startLoad(ns, addr string, workers int) *load {
	l := &load{ns: ns, addr: addr, stopc: make(chan struct{}), failures: map[string]int{}}
	for w := range workers {
		l.wg.Go(func() {
			msg := []byte(fmt.Sprintf("worker %d says hello through the mesh", w))
			for {
				select {
				case <-l.stopc:
					return
				default:
				}
				start := time.Now()
				err := call(ns, addr, msg)
				l.record(start, time.Now(), err)
			}
		})
	}
	return l
}

// burst starts n connections at once, from as many goroutines, each
// recorded as the load's are; it returns a func that waits for them.
func (l *load) burst(n int) (wait func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			msg := fmt.Appendf(nil, "burst %d says hello through the mesh", i)
			<-start
			begin := time.Now()
			err := call(l.ns, l.addr, msg)
			l.record(begin, time.Now(), err)
		})
	}
	close(start)
	return wg.Wait
}

// call is one short connection.
func call(ns, addr string, msg []byte) error {
	c, err := dialIn(ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("%w: %d of %d bytes", errShortEcho, len(got), len(msg))
	}
	return nil
}

// errShortEcho: the connection ended without the whole echo, as when a
// proxy closes a connection it could not carry.
var errShortEcho = errors.New("short echo")

func (l *load) record(start, end time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.ok++
		l.ends = append(l.ends, end)
		l.longest = max(l.longest, end.Sub(start))
		return
	}
	kind := "other"
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		kind = "reset"
	case errors.Is(err, errShortEcho):
		kind = "short_echo"
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	}
	l.failures[kind]++
	if l.first == nil {
		l.first = err
	}
}

func (l *load) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok
}

// stop ends the load, once, and returns what it saw.
func (l *load) stop() loadResult {
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	ends := slices.Clone(l.ends)
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(ends); i++ {
		gap = max(gap, ends[i].Sub(ends[i-1]))
	}
	failures := map[string]int{}
	for k, v := range l.failures {
		failures[k] = v
	}
	return loadResult{ok: l.ok, failures: failures, first: l.first, longest: l.longest, gap: gap}
}
