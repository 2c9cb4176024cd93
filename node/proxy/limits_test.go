package proxy

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHandshakes: the pending-handshake set refuses a source past its
// bound, evicts (and closes) the oldest when full, and forgets a
// handshake once, whatever ends it.
func TestHandshakes(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::3")
	type step struct {
		start netip.Addr // a handshake from start, or
		done  int        // done on the handshake started at this step (1-based)
	}
	type result struct {
		Started  []bool // per start: registered
		Evicted  []int  // the steps whose handshake was evicted, in order
		Closed   []int  // the steps whose connection was closed
		Pending  int
		BySource map[netip.Addr]int
	}
	for _, tt := range []struct {
		name           string
		max, perSource int
		steps          []step
		want           result
	}{
		{"within both bounds", 4, 2, []step{{start: a}, {start: b}, {start: a}},
			result{Started: []bool{true, true, true}, Pending: 3, BySource: map[netip.Addr]int{a: 2, b: 1}}},
		{"a source past its bound is refused", 10, 2, []step{{start: a}, {start: a}, {start: a}, {start: b}},
			result{Started: []bool{true, true, false, true}, Pending: 3, BySource: map[netip.Addr]int{a: 2, b: 1}}},
		{"done frees the source's slot, once", 10, 1, []step{{start: a}, {done: 1}, {done: 1}, {start: a}},
			result{Started: []bool{true, true}, Pending: 1, BySource: map[netip.Addr]int{a: 1}}},
		{"full: the oldest is evicted and closed", 2, 2, []step{{start: a}, {start: b}, {start: c}, {start: c}},
			result{Started: []bool{true, true, true, true}, Evicted: []int{1, 2}, Closed: []int{1, 2}, Pending: 2, BySource: map[netip.Addr]int{c: 2}}},
		{"an evicted handshake's done does nothing", 1, 1, []step{{start: a}, {start: b}, {done: 1}},
			result{Started: []bool{true, true}, Evicted: []int{1}, Closed: []int{1}, Pending: 1, BySource: map[netip.Addr]int{b: 1}}},
		{"the oldest still pending goes first", 2, 2, []step{{start: a}, {start: b}, {done: 1}, {start: c}, {start: c}},
			result{Started: []bool{true, true, true, true}, Evicted: []int{2}, Closed: []int{2}, Pending: 2, BySource: map[netip.Addr]int{c: 2}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s handshakes
			got := result{BySource: map[netip.Addr]int{}}
			hs := map[int]*handshake{}
			peers := map[int]net.Conn{}
			for i, st := range tt.steps {
				n := i + 1
				if st.done != 0 {
					hs[st.done].done()
					continue
				}
				ours, theirs := net.Pipe()
				t.Cleanup(func() { ours.Close(); theirs.Close() })
				h, evicted := s.start(ours, st.start, tt.max, tt.perSource)
				got.Started = append(got.Started, h != nil)
				if evicted {
					for m, old := range hs {
						if old.evicted.Load() && !slices.Contains(got.Evicted, m) {
							got.Evicted = append(got.Evicted, m)
						}
					}
				}
				if h != nil {
					hs[n], peers[n] = h, theirs
				}
			}
			for n := 1; n <= len(tt.steps); n++ {
				if p, ok := peers[n]; ok {
					// A closed pipe's peer reads at once; an open one would
					// block, so only those evicted are read.
					if hs[n].evicted.Load() {
						if _, err := p.Read(make([]byte, 1)); err != nil {
							got.Closed = append(got.Closed, n)
						}
					}
				}
			}
			got.Pending = s.pending()
			s.mu.Lock()
			for k, v := range s.bySource {
				got.BySource[k] = v
			}
			s.mu.Unlock()
			if tt.want.BySource == nil {
				tt.want.BySource = map[netip.Addr]int{}
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("handshakes (-want +got):\n%s", diff)
			}
		})
	}
}
