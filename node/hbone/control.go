package hbone

import (
	"fmt"

	"golang.org/x/net/http2"
)

// The read loop answers the peer (acknowledgements, resets, window
// updates) without ever writing to the socket itself: a peer that sends
// but does not read would otherwise stop the read loop, and every
// stream of the connection with it. Its frames wait in a queue bounded
// by Limits.MaxControlQueue, which the next writer drains first, or a
// goroutine started for the purpose when no writer is active.

type ctrlKind uint8

const (
	ctrlSettingsAck ctrlKind = iota
	ctrlPingAck
	ctrlWindowUpdate // val: increment
	ctrlReset        // val: error code
	ctrlStatus       // val: HTTP status, sent with END_STREAM
)

// ctrlFrame is a queued control frame.
type ctrlFrame struct {
	kind   ctrlKind
	stream uint32
	val    uint32
	ping   [8]byte
}

// queueControl queues f for writing; only the read loop calls it. A full
// queue is the peer's doing, an error that ends the connection.
func (c *conn) queueControl(f ctrlFrame) error {
	c.cmu.Lock()
	if f.kind == ctrlWindowUpdate && f.stream == 0 && c.ctrlConnUpdate >= 0 {
		// One connection update carries them all.
		c.ctrl[c.ctrlConnUpdate].val += f.val
		c.cmu.Unlock()
		return nil
	}
	if len(c.ctrl) >= c.lim.MaxControlQueue {
		c.cmu.Unlock()
		return fmt.Errorf("%w: %d control frames wait for a peer that does not read", ErrFlood, len(c.ctrl))
	}
	if f.kind == ctrlWindowUpdate && f.stream == 0 {
		c.ctrlConnUpdate = len(c.ctrl)
	}
	c.ctrl = append(c.ctrl, f)
	c.ctrlPending.Store(true)
	start := !c.ctrlFlushing
	c.ctrlFlushing = true
	c.cmu.Unlock()
	if start {
		go c.flushControl()
	}
	return nil
}

// flushControl writes queued control frames until the queue is empty.
func (c *conn) flushControl() {
	for {
		err := c.writeFrames(func() error { return nil })
		c.cmu.Lock()
		if err != nil || len(c.ctrl) == 0 {
			c.ctrlFlushing = false
			c.cmu.Unlock()
			return
		}
		c.cmu.Unlock()
	}
}

// dropControl forgets queued frames: the connection is ending.
func (c *conn) dropControl() {
	c.cmu.Lock()
	c.ctrl, c.ctrlConnUpdate = nil, -1
	c.ctrlPending.Store(false)
	c.cmu.Unlock()
}

// writeControlLocked writes the queued control frames; callers hold wmu.
func (c *conn) writeControlLocked() error {
	if !c.ctrlPending.Load() {
		return nil
	}
	c.cmu.Lock()
	batch := c.ctrl
	c.ctrl, c.ctrlSpare = c.ctrlSpare[:0], nil
	c.ctrlConnUpdate = -1
	c.ctrlPending.Store(false)
	c.cmu.Unlock()
	var err error
	for _, f := range batch {
		if err = c.writeControl(f); err != nil {
			break
		}
	}
	if cap(batch) <= 64 {
		// Keep a small buffer for next time; a large one (a flood)
		// goes back to the collector.
		c.ctrlSpare = batch[:0]
	}
	return err
}

func (c *conn) writeControl(f ctrlFrame) error {
	switch f.kind {
	case ctrlSettingsAck:
		return c.fr.WriteSettingsAck()
	case ctrlPingAck:
		return c.fr.WritePing(true, f.ping)
	case ctrlWindowUpdate:
		return c.fr.WriteWindowUpdate(f.stream, f.val)
	case ctrlReset:
		return c.fr.WriteRSTStream(f.stream, http2.ErrCode(f.val))
	case ctrlStatus:
		block := c.encodeHeaders([][2]string{{":status", fmt.Sprint(f.val)}})
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.stream, BlockFragment: block, EndHeaders: true, EndStream: true})
	}
	return nil
}
