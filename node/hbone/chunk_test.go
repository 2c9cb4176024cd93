package hbone

import "testing"

func TestChunkClass(t *testing.T) {
	for _, tt := range []struct{ n, size int }{
		{1, 16 << 10},
		{16 << 10, 16 << 10},
		{16<<10 + 1, 32 << 10},
		{100 << 10, 128 << 10},
		{512<<10 + 1, 1 << 20},
		{MaxFrame, 1 << 20},
	} {
		ch := newChunk(tt.n)
		if got := cap(ch.b); got != tt.size {
			t.Errorf("newChunk(%d) holds %d bytes, want %d", tt.n, got, tt.size)
		}
		if n := ch.fill(make([]byte, tt.n)); n != tt.n {
			t.Errorf("fill(%d bytes) took %d", tt.n, n)
		}
		ch.release()
	}
}
