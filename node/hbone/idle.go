package hbone

import (
	"fmt"
	"time"
)

// A connection without streams for Limits.IdleTimeout ends with GOAWAY
// NO_ERROR. One timer per connection checks it: it fires every
// IdleTimeout at most, and rearms for what is left when streams came
// and went meanwhile, so that opening and closing streams costs nothing.

// startIdle starts the idle timer, once the connection is up.
func (c *conn) startIdle() {
	if c.lim.IdleTimeout < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.idleTimer = time.AfterFunc(c.lim.IdleTimeout, c.checkIdle)
	}
}

// stopIdle stops the idle timer, the connection having ended.
func (c *conn) stopIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
}

// checkIdle ends the connection if it has been idle for IdleTimeout, or
// rearms the timer.
func (c *conn) checkIdle() {
	c.idleChecks.Add(1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	busy := len(c.streams) > 0 || c.handlers > 0
	left := c.lim.IdleTimeout - time.Since(c.idleSince)
	switch {
	case busy:
		c.idleTimer.Reset(c.lim.IdleTimeout)
	case left > 0:
		c.idleTimer.Reset(left)
	default:
		// No new stream from here on: one the peer sends meanwhile has a
		// higher ID than the GOAWAY reports, and the peer retries it.
		c.goAway, c.draining = true, true
		last := c.lastPeerStream
		c.mu.Unlock()
		c.goAwayGracefully(last, fmt.Errorf("%w: idle for %v", ErrConnClosed, c.lim.IdleTimeout))
		return
	}
	c.mu.Unlock()
}
