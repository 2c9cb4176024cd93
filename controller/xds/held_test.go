package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// proxyModel is what a proxy holds after applying responses: name → version.
type proxyModel map[string]string

func (p proxyModel) apply(d delta) {
	for _, r := range d.resources {
		p[r.Name] = r.Version
	}
	for _, n := range d.removed {
		delete(p, n)
	}
}

func tableVersions(t *Table) map[string]string {
	out := map[string]string{}
	for _, n := range t.Names(addrType) {
		out[n] = t.Get(addrType, n).Version
	}
	return out
}

func heldVersions(h *held) map[string]string {
	out := map[string]string{}
	for n, r := range h.all() {
		out[n] = r.Version
	}
	if len(out) != h.len() {
		panic(fmt.Sprintf("held counts %d names, yields %d", h.len(), len(out)))
	}
	return out
}

// TestWildcardWatchFollowsTheTable drives a wildcard watch through random
// table changes, marked as the push pipeline marks them (after the
// table), with responses at random moments (also between a change and
// its mark), overflowing the pending bound
// and compacting on the way, and a reconnect that starts from what the
// proxy holds. Whenever every change has been answered, the proxy holds
// the table and the watch knows exactly what the proxy holds.
func TestWildcardWatchFollowsTheTable(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			tbl := NewTable()
			const names = 3000
			ip := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", i/65536, (i/256)%256, i%256) }
			round := 0
			change := func() string {
				i := rng.IntN(names)
				a := pod(fmt.Sprintf("p%d", i), fmt.Sprintf("node-%d", round), ip(i))
				name := "Kubernetes//Pod/default/" + a.GetWorkload().GetName()
				if rng.IntN(4) == 0 {
					tbl.Put(addrType, name, nil)
					return name
				}
				put(t, tbl, a)
				return name
			}
			for range names / 2 {
				change()
			}
			w := newWatch(addrType)
			if err := w.start(tbl, subscription{}, 1<<20); err != nil {
				t.Fatal(err)
			}
			proxy := proxyModel{}
			limit := 700 // the pending bound, crossed now and then
			for step := range 300 {
				round = step
				var changed []string
				for range rng.IntN(60) {
					changed = append(changed, change())
				}
				if rng.IntN(20) == 0 {
					for range 800 {
						changed = append(changed, change())
					}
				}
				if rng.IntN(4) == 0 {
					// A response between the table's change and its mark,
					// as when a proxy's sender runs during a commit.
					proxy.apply(w.next(tbl, ""))
				}
				w.mark(changed, time.Now(), limit)
				if rng.IntN(3) == 0 {
					continue // the proxy is behind for a while
				}
				proxy.apply(w.next(tbl, ""))
				// maps.Equal first: cmp.Diff of thousands of names is slow.
				if want := tableVersions(tbl); !maps.Equal(want, proxy) {
					t.Fatalf("step %d: proxy differs from the table (-table +proxy):\n%s", step, cmp.Diff(want, map[string]string(proxy)))
				}
				if rec := heldVersions(w.sent); !maps.Equal(rec, proxy) {
					t.Fatalf("step %d: the watch's record differs from the proxy (-proxy +record):\n%s", step, cmp.Diff(map[string]string(proxy), rec))
				}
				if rng.IntN(50) == 0 {
					// Reconnect: a new watch from what the proxy says it holds.
					w = newWatch(addrType)
					if err := w.start(tbl, subscription{initialVersions: maps.Clone(proxy)}, 1<<20); err != nil {
						t.Fatal(err)
					}
				}
			}
			if w.sent.differences() > compactAfter(len(w.sent.base))+60+800 {
				t.Errorf("the watch keeps %d differences from its snapshot", w.sent.differences())
			}
		})
	}
}

// TestWatchesShareASnapshot: proxies that compared the whole table against
// the same table share one snapshot and keep no names of their own.
func TestWatchesShareASnapshot(t *testing.T) {
	tbl := NewTable()
	for i := range 1000 {
		put(t, tbl, pod(fmt.Sprintf("p%d", i), "node-1", fmt.Sprintf("10.0.%d.%d", i/256, i%256)))
	}
	var ws []*watch
	for range 3 {
		w := newWatch(addrType)
		if err := w.start(tbl, subscription{}, 1<<20); err != nil {
			t.Fatal(err)
		}
		if d := w.next(tbl, ""); len(d.resources) != 1000 {
			t.Fatalf("first response has %d resources, want 1000", len(d.resources))
		}
		ws = append(ws, w)
	}
	for i, w := range ws {
		if w.sent.differences() != 0 || w.sent.len() != 1000 {
			t.Errorf("watch %d: %d differences, %d held; want 0 and 1000", i, w.sent.differences(), w.sent.len())
		}
		if fmt.Sprintf("%p", w.sent.base) != fmt.Sprintf("%p", ws[0].sent.base) {
			t.Errorf("watch %d compared against a snapshot of its own", i)
		}
	}
}
