package hbone

import (
	"math/bits"
	"sync"
)

// Receive buffers come in power-of-two sizes from minChunk to MaxFrame,
// one pool each. A frame gets the smallest size that holds it, so a new
// chunk is at least half used (tiny frames aside, which later frames
// fill: see Stream.deliver); a single size per frame length class would
// let a peer pin a 1 MiB buffer with a 16 KiB + 1 byte frame.
const (
	minChunkShift = 14 // 16 KiB
	minChunk      = 1 << minChunkShift
	chunkClasses  = 20 - minChunkShift + 1 // up to MaxFrame (1 MiB)
	// maxChunks bounds a stream's queue. Every queued chunk but the
	// first (being read) and the last (being filled) is full, so a peer
	// within the stream window never reaches it.
	maxChunks = StreamWindow/minChunk + 2
)

// chunk is a pooled receive buffer: b[off:] is unread.
type chunk struct {
	b     []byte
	off   int
	class int
}

// chunkPools holds free chunks, one pool per size class.
var chunkPools = func() *[chunkClasses]sync.Pool {
	var p [chunkClasses]sync.Pool
	for i := range p {
		size := minChunk << i
		p[i].New = func() any { return &chunk{b: make([]byte, 0, size), class: i} }
	}
	return &p
}()

// readBuffers are ReadFrom's large read buffers.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// chunkClass is the smallest class whose chunks hold n bytes (n at most
// MaxFrame).
func chunkClass(n int) int {
	if n <= minChunk {
		return 0
	}
	return bits.Len(uint(n-1)) - minChunkShift
}

// newChunk returns an empty chunk for up to n bytes (at most a frame).
func newChunk(n int) *chunk {
	ch := chunkPools[chunkClass(n)].Get().(*chunk)
	ch.off, ch.b = 0, ch.b[:0]
	return ch
}

// fill appends as much of data as the chunk has room for and returns
// how much that was.
func (c *chunk) fill(data []byte) int {
	n := copy(c.b[len(c.b):cap(c.b)], data)
	c.b = c.b[:len(c.b)+n]
	return n
}

func (c *chunk) release() { chunkPools[c.class].Put(c) }
