package ambient

// Labels are the labels or annotations of an object that other objects'
// outputs depend on (a namespace's, a node's), read by key only. Every
// key read is reported: the index learns from the builders themselves
// which keys its tables depend on, and recomputes when one of those
// changes and only then. A builder that starts reading another key is
// tracked without anyone listing it.
type Labels struct {
	m    map[string]string
	read func(key string)
}

// ReadLabels is a view of m that reports each key read to read (nil:
// reports nothing).
func ReadLabels(m map[string]string, read func(key string)) Labels {
	return Labels{m: m, read: read}
}

// Lookup returns the value under key and whether it is set.
func (l Labels) Lookup(key string) (string, bool) {
	if l.read != nil {
		l.read(key)
	}
	v, ok := l.m[key]
	return v, ok
}

// Get returns the value under key, "" when unset.
func (l Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}
