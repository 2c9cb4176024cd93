package hbone

import (
	"fmt"
	"time"
)

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
	// Pings and Settings bound the PING and SETTINGS frames the peer
	// sends: each costs an acknowledgement, and a SETTINGS frame can
	// touch every stream. A legitimate peer sends a few.
	Pings    Rate
	Settings Rate
	// Resets bounds stream resets: RST_STREAM frames from the peer, and
	// streams refused or reset for its errors (past MaxStreams, past a
	// window, malformed). A peer resetting streams as fast as it opens
	// them makes the server start work it never finishes (the rapid
	// reset attack, CVE-2023-44487).
	Resets Rate
	// MaxEmptyFrames is how many frames without payload (DATA without
	// END_STREAM) the peer may send in a row: they cost it nothing,
	// neither window nor progress.
	MaxEmptyFrames int
}

// Rate is a token bucket: Burst events at once, then PerSecond.
type Rate struct {
	Burst     int
	PerSecond float64
}

// DefaultLimits are the limits of Serve and NewClientConn.
func DefaultLimits() Limits {
	return Limits{
		MaxStreams:      MaxStreams,
		MaxControlQueue: 1000,
		Pings:           Rate{Burst: 100, PerSecond: 10},
		Settings:        Rate{Burst: 100, PerSecond: 10},
		// A burst of every stream at once (the peer's side of them
		// failing together), then 100 a second.
		Resets: Rate{Burst: MaxStreams, PerSecond: 100},
		// As Envoy's max_consecutive_inbound_frames_with_empty_payload.
		MaxEmptyFrames: 1,
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
	l.Pings = l.Pings.or(d.Pings)
	l.Settings = l.Settings.or(d.Settings)
	l.Resets = l.Resets.or(d.Resets)
	if l.MaxEmptyFrames <= 0 {
		l.MaxEmptyFrames = d.MaxEmptyFrames
	}
	return l
}

func (r Rate) String() string {
	return fmt.Sprintf("%d at once, then %g a second", r.Burst, r.PerSecond)
}

// or is r, or d where r is not set.
func (r Rate) or(d Rate) Rate {
	if r.Burst <= 0 {
		r.Burst = d.Burst
	}
	if r.PerSecond <= 0 {
		r.PerSecond = d.PerSecond
	}
	return r
}

// bucket counts events against a Rate. It is not safe for concurrent
// use: the read loop owns a connection's buckets.
type bucket struct {
	tokens float64
	last   time.Time
}

// take spends a token at now; it reports false when none is left.
func (b *bucket) take(r Rate, now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = float64(r.Burst)
	} else if now.After(b.last) {
		b.tokens = min(float64(r.Burst), b.tokens+now.Sub(b.last).Seconds()*r.PerSecond)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
