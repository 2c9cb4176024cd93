package xds

import (
	"fmt"
	"time"
)

// heldVersion stands for a resource a reconnecting proxy says it holds:
// only its name and version. The next response compares it with the
// table by version (a hash of the content, the same in every controller
// process): an equal one is not sent, a different one is replaced, a
// missing one removed.
func heldVersion(name, version string) *Resource {
	return &Resource{Name: name, Version: version}
}

// watch is one connection's subscription to one type: what the proxy asked
// for, what it holds, and what may have changed since the last response.
// The connection serializes access.
type watch struct {
	typeURL string
	// wildcard: every resource of the type (wire contract §2.3).
	wildcard bool
	// subscribed are on-demand keys: names or aliases (wire contract §2.4).
	subscribed map[string]struct{}
	// sent is what the proxy holds: exactly the *Resource last sent.
	sent *held

	// answer are keys subscribed since the last response; each is answered,
	// with its resources even if unchanged, or as removed if unknown.
	answer map[string]struct{}
	// dirty are names changed since the last response; full replaces them
	// with the whole table once they grow past the connection's bound.
	dirty   map[string]struct{}
	full    bool
	initial bool
	// compact: the next response compares the whole table, so that sent
	// shares a snapshot again instead of keeping many differences.
	compact bool
	// oldest is when the earliest change waiting to be sent happened.
	oldest time.Time
	// charge is what subscribed costs the stream's caller.
	charge chargedNames
}

// add subscribes to an on-demand key.
func (w *watch) add(name string) {
	if _, ok := w.subscribed[name]; !ok {
		w.subscribed[name] = struct{}{}
		w.charge.cost += nameCost(name)
	}
}

func newWatch(typeURL string) *watch {
	return &watch{
		typeURL:    typeURL,
		subscribed: map[string]struct{}{},
		sent:       newHeld(),
		answer:     map[string]struct{}{},
		dirty:      map[string]struct{}{},
	}
}

// subscription is the part of a DeltaDiscoveryRequest that changes a watch.
type subscription struct {
	subscribe, unsubscribe []string
	// initialVersions is set on a stream's first request of a type.
	initialVersions map[string]string
}

// start applies a type's first request (wire contract §2.3): an empty
// subscribe list means wildcard, and initial_resource_versions is what a
// reconnecting proxy holds, unchanged resources are not sent again.
func (w *watch) start(t *Table, s subscription, limit int) error {
	if len(s.subscribe) == 0 {
		w.wildcard = true
	}
	if len(s.initialVersions) > limit {
		return fmt.Errorf("%d initial resource versions, limit %d", len(s.initialVersions), limit)
	}
	for name, version := range s.initialVersions {
		if version == "" {
			// Requested on demand but not received: still wanted.
			w.add(name)
			w.answer[name] = struct{}{}
			continue
		}
		w.sent.set(name, heldVersion(name, version))
		w.add(name)
	}
	w.full, w.initial = true, true
	return w.update(t, s, limit)
}

// update applies subscription changes. "*" subscribes or unsubscribes the
// wildcard; ztunnel's on-demand mode sends both, meaning "nothing yet".
func (w *watch) update(t *Table, s subscription, limit int) error {
	for _, name := range s.subscribe {
		if name == "*" {
			if !w.wildcard {
				w.wildcard, w.full = true, true
			}
			continue
		}
		w.add(name)
		w.answer[name] = struct{}{}
	}
	if len(w.subscribed) > limit {
		return fmt.Errorf("%d subscribed names, limit %d", len(w.subscribed), limit)
	}
	for _, name := range s.unsubscribe {
		if name == "*" {
			w.wildcard = false
			continue
		}
		if _, ok := w.subscribed[name]; ok {
			delete(w.subscribed, name)
			w.charge.cost -= nameCost(name)
		}
		delete(w.answer, name)
		// The proxy drops what it unsubscribed; stop sending it.
		w.sent.del(name)
		for _, n := range t.Resolve(w.typeURL, name) {
			w.sent.del(n)
		}
	}
	return nil
}

// mark records names that changed at time at. Past limit pending names the
// watch falls back to comparing the whole table, so a slow proxy costs a
// bounded amount of memory however much changes.
func (w *watch) mark(names []string, at time.Time, limit int) {
	if len(names) == 0 {
		return
	}
	if w.oldest.IsZero() || at.Before(w.oldest) {
		w.oldest = at
	}
	if w.full {
		return
	}
	for _, n := range names {
		w.dirty[n] = struct{}{}
	}
	if len(w.dirty) > limit {
		w.full = true
		clear(w.dirty)
	}
}

// pending reports whether the watch has something to send.
func (w *watch) pending() bool {
	return w.initial || w.full || len(w.dirty) > 0 || len(w.answer) > 0
}

// delta is one response's content.
type delta struct {
	resources []*Resource
	removed   []string
	// initial is the type's first response, sent even when empty.
	initial bool
	// oldest is when the earliest change it carries happened.
	oldest time.Time
}

func (d delta) empty() bool { return len(d.resources) == 0 && len(d.removed) == 0 }

// compactAfter is how many differences from its snapshot a wildcard
// watch keeps before its next response compares the whole table again.
func compactAfter(snapshot int) int { return max(512, snapshot/16) }

// next computes the response that brings the proxy up to date with t and
// records it as sent. node is the proxy's node: on-demand proxies get its
// workloads without asking (wire contract §2.4).
//
// A wildcard watch compared in full is compared against a frozen snapshot
// of the table, which the proxy then holds exactly: sent shares it.
func (w *watch) next(t *Table, node string) delta {
	d := delta{initial: w.initial, oldest: w.oldest}
	removed := map[string]bool{}
	remove := func(name string) {
		if !removed[name] {
			removed[name] = true
			d.removed = append(d.removed, name)
		}
	}
	var snap map[string]*Resource
	if w.wildcard && (w.full || w.compact) {
		snap = t.Frozen(w.typeURL)
	}
	get := func(name string) *Resource {
		if snap != nil {
			return snap[name]
		}
		return t.Get(w.typeURL, name)
	}
	candidates := map[string]struct{}{}
	answered := map[string]bool{}
	// Answers first: they are sent even when the proxy holds them, so a
	// lookup by alias always completes; a service brings its workloads.
	for key := range w.answer {
		names := t.Resolve(w.typeURL, key)
		if len(names) == 0 {
			remove(key)
			continue
		}
		for _, n := range names {
			if cur := get(n); cur != nil && !answered[n] {
				answered[n] = true
				d.resources = append(d.resources, cur)
				w.sent.set(n, cur)
				candidates[n] = struct{}{}
				for _, wl := range t.ServiceWorkloads(n) {
					candidates[wl] = struct{}{}
				}
			}
		}
	}
	switch {
	case snap != nil:
		w.compareSnapshot(snap, answered, &d, remove)
	case w.full:
		for _, n := range t.Names(w.typeURL) {
			w.consider(t, n, node, answered, &d, remove)
		}
		// What the proxy holds and the table lost is removed.
		for n := range w.sent.all() {
			w.consider(t, n, node, answered, &d, remove)
		}
	default:
		for n := range w.dirty {
			w.consider(t, n, node, answered, &d, remove)
		}
	}
	for n := range candidates {
		w.consider(t, n, node, answered, &d, remove)
	}
	clear(w.answer)
	clear(w.dirty)
	w.full, w.initial, w.compact, w.oldest = false, false, false, time.Time{}
	if w.wildcard && w.sent.differences() > compactAfter(len(w.sent.base)) {
		w.compact = true
	}
	return d
}

// compareSnapshot sends what the proxy lacks of snap, removes what snap
// lacks, and records that the proxy holds snap.
func (w *watch) compareSnapshot(snap map[string]*Resource, answered map[string]bool, d *delta, remove func(string)) {
	for name, cur := range snap {
		if answered[name] {
			continue
		}
		if had := w.sent.get(name); had == cur || (had != nil && had.Version == cur.Version) {
			continue // unchanged, or what a reconnecting proxy said it holds
		}
		d.resources = append(d.resources, cur)
	}
	for name := range w.sent.all() {
		if snap[name] == nil {
			remove(name)
		}
	}
	w.sent.rebase(snap)
}

// consider brings one name up to date with t; a name may come twice.
func (w *watch) consider(t *Table, name, node string, answered map[string]bool, d *delta, remove func(string)) {
	if answered[name] {
		return
	}
	cur, had := t.Get(w.typeURL, name), w.sent.get(name)
	if cur == nil {
		if had != nil {
			w.sent.del(name)
			remove(name)
		}
		return
	}
	if had == cur {
		return
	}
	if had != nil && had.Version == cur.Version {
		// What a reconnecting proxy said it holds, unchanged.
		w.sent.set(name, cur)
		return
	}
	if had != nil || w.wants(cur, node) {
		d.resources = append(d.resources, cur)
		w.sent.set(name, cur)
	}
}

// wants reports whether the proxy subscribed to r (wire contract §2.4): by
// name or alias, as a workload on its node, or as a workload of a service it
// holds.
func (w *watch) wants(r *Resource, node string) bool {
	if w.wildcard {
		return true
	}
	if _, ok := w.subscribed[r.Name]; ok {
		return true
	}
	for _, a := range r.Aliases {
		if _, ok := w.subscribed[a]; ok {
			return true
		}
	}
	if node != "" && r.node == node {
		return true
	}
	for _, s := range r.services {
		if _, ok := w.subscribed[s]; ok {
			return true
		}
		if w.sent.get(s) != nil {
			return true
		}
	}
	return false
}
