package xds

import "iter"

// held is what a proxy holds of one type, by name: the *Resource last sent
// to it (or a stand-in with the version a reconnecting proxy said it
// holds).
//
// Most proxies watch the whole table, and after a full comparison they
// hold exactly a snapshot of it (Table.Frozen). Their held shares that
// snapshot (base) with every other connection that compared against it,
// and keeps only its own differences (over): a connection then costs the
// changes since its last full comparison, not a map of the whole table.
type held struct {
	// base is a frozen table snapshot, never written; nil for none.
	base map[string]*Resource
	// over overrides base: a nil value is a name of base not held.
	over map[string]*Resource
	n    int
}

func newHeld() *held { return &held{over: map[string]*Resource{}} }

// get returns what the proxy holds of name, or nil.
func (h *held) get(name string) *Resource {
	if r, ok := h.over[name]; ok {
		return r
	}
	return h.base[name]
}

// set records that the proxy holds r under name.
func (h *held) set(name string, r *Resource) {
	if h.get(name) == nil {
		h.n++
	}
	if h.base[name] == r {
		delete(h.over, name)
		return
	}
	h.over[name] = r
}

// del records that the proxy no longer holds name.
func (h *held) del(name string) {
	if h.get(name) == nil {
		return
	}
	h.n--
	if _, ok := h.base[name]; ok {
		h.over[name] = nil
		return
	}
	delete(h.over, name)
}

func (h *held) len() int { return h.n }

// differences is how many names differ from the shared snapshot.
func (h *held) differences() int { return len(h.over) }

// rebase records that the proxy holds exactly the snapshot base.
func (h *held) rebase(base map[string]*Resource) {
	h.base, h.n = base, len(base)
	clear(h.over)
}

// all yields every name held with its resource. The body may del or set
// names already held, not add new ones.
func (h *held) all() iter.Seq2[string, *Resource] {
	return func(yield func(string, *Resource) bool) {
		for name, r := range h.over {
			if r != nil && !yield(name, r) {
				return
			}
		}
		for name, r := range h.base {
			if _, ok := h.over[name]; ok {
				continue
			}
			if !yield(name, r) {
				return
			}
		}
	}
}
