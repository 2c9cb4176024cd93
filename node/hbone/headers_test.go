package hbone

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// readBlock writes fields as a HEADERS frame and, past split bytes of
// block, CONTINUATIONs, and reads them back through a headerReader.
func readBlock(t *testing.T, fields []hpack.HeaderField, split int) (*headerBlock, error) {
	t.Helper()
	var enc bytes.Buffer
	e := hpack.NewEncoder(&enc)
	for _, f := range fields {
		if err := e.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	block := enc.Bytes()
	var wire bytes.Buffer
	w := http2.NewFramer(&wire, nil)
	first := block[:min(split, len(block))]
	_ = w.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(first) == len(block), EndStream: true})
	for rest := block[len(first):]; len(rest) > 0; rest = rest[min(split, len(rest)):] {
		_ = w.WriteContinuation(1, len(rest) <= split, rest[:min(split, len(rest))])
	}
	r := http2.NewFramer(nil, &wire)
	h := newHeaderReader()
	for {
		f, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("read frames back: %v", err)
		}
		var b *headerBlock
		switch f := f.(type) {
		case *http2.HeadersFrame:
			b, err = h.headers(f)
		case *http2.ContinuationFrame:
			b, err = h.continuation(f)
		}
		if b != nil || err != nil {
			return b, err
		}
	}
}

func TestHeaderReader(t *testing.T) {
	field := func(kv ...string) []hpack.HeaderField {
		var fs []hpack.HeaderField
		for i := 0; i < len(kv); i += 2 {
			fs = append(fs, hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return fs
	}
	connect := field(":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", "k=v")
	for _, tt := range []struct {
		name      string
		fields    []hpack.HeaderField
		malformed bool
		err       error
	}{
		{"request", connect, false, nil},
		{"upper-case name", field(":method", "CONNECT", "Baggage", "k=v"), true, nil},
		{"pseudo-header after a regular one", field("baggage", "k=v", ":method", "CONNECT"), true, nil},
		{"pseudo-header twice", field(":method", "CONNECT", ":method", "GET"), true, nil},
		{"unknown pseudo-header", field(":method", "CONNECT", ":x", "y"), true, nil},
		{"value with a NUL", field(":method", "CONNECT", "baggage", "k=\x00"), true, nil},
		{"past MaxHeaderList", field(":method", "CONNECT", "x-pad", string(make([]byte, MaxHeaderList))), false, ErrProtocol},
	} {
		for _, split := range []int{1 << 20, 3} {
			t.Run(tt.name, func(t *testing.T) {
				b, err := readBlock(t, tt.fields, split)
				if !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				if err != nil {
					return
				}
				if got := b.malformed != nil; got != tt.malformed {
					t.Errorf("malformed = %v (%v), want %v", got, b.malformed, tt.malformed)
				}
				if !tt.malformed {
					if diff := cmp.Diff(tt.fields, b.fields); diff != "" {
						t.Errorf("fields (-want +got):\n%s", diff)
					}
				}
				if b.stream != 1 || !b.endStream {
					t.Errorf("stream %d, end %v; want 1, true", b.stream, b.endStream)
				}
			})
		}
	}
}
