package hbone

// Limits bound what the peer of one connection can make it hold or do;
// Serve and NewClientConn use DefaultLimits, ServeWith and
// NewClientConnWith take them. A zero field means its default, so a
// caller sets only what it changes.
type Limits struct {
	// MaxStreams is how many streams the peer may have open at once
	// (advertised as SETTINGS_MAX_CONCURRENT_STREAMS).
	MaxStreams int
	// MaxControlQueue is how many control frames (PING and SETTINGS
	// acknowledgements, RST_STREAM, WINDOW_UPDATE) may wait to be
	// written. Only a peer that sends without reading fills it.
	MaxControlQueue int
}

// DefaultLimits are the limits of Serve and NewClientConn.
func DefaultLimits() Limits {
	return Limits{
		MaxStreams:      MaxStreams,
		MaxControlQueue: 1000,
	}
}

// withDefaults fills the zero fields of l from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	if l.MaxControlQueue <= 0 {
		l.MaxControlQueue = d.MaxControlQueue
	}
	return l
}
