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
	// (advertised as SETTINGS_MAX_CONCURRENT_STREAMS) and, on the
	// server, how many handlers may run at once: a handler holds its
	// slot until it returns, even when its stream was reset.
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
	// END_STREAM, HEADERS or CONTINUATION without a header fragment) the
	// peer may send in a row: they cost it nothing, neither window nor
	// progress. A frame with payload starts the count again.
	MaxEmptyFrames int

	// HandshakeTimeout bounds the wait for the peer's first SETTINGS
	// frame and, on the server, the client preface before it.
	HandshakeTimeout time.Duration
	// IdleTimeout ends a connection (GOAWAY NO_ERROR) that has had no
	// stream (nor, on the server, running handler) for this long. A
	// negative value disables it.
	IdleTimeout time.Duration
	// ConnectTimeout bounds Connect's wait for the answer to a CONNECT,
	// whatever the deadline of the caller's context.
	ConnectTimeout time.Duration
	// WriteTimeout ends a connection whose writes have made no progress
	// for this long: a peer that stops reading. A negative value
	// disables it.
	WriteTimeout time.Duration
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
		MaxEmptyFrames:   1,
		HandshakeTimeout: 10 * time.Second,
		// Longer than the node proxy's pool keeps an idle connection
		// (5 minutes), so that the client, which knows when it will
		// need the connection again, is the one to close it.
		IdleTimeout:    10 * time.Minute,
		ConnectTimeout: 30 * time.Second,
		// Long enough for a peer busy elsewhere; a peer that has not
		// read for a minute has gone.
		WriteTimeout: time.Minute,
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
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = d.HandshakeTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.ConnectTimeout <= 0 {
		l.ConnectTimeout = d.ConnectTimeout
	}
	if l.WriteTimeout == 0 {
		l.WriteTimeout = d.WriteTimeout
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
