package hbone

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Header blocks are assembled here rather than by the Framer
// (ReadMetaHeaders), which reads a HEADERS frame's CONTINUATIONs inside
// one ReadFrame: there the read loop cannot count them, and a peer
// sending CONTINUATIONs without payload, forever, keeps it in that call.
// Here every frame passes through the read loop and its limits.
//
// A block whose encoded or decoded size passes MaxHeaderList ends the
// connection: it cannot be skipped without decoding it (HPACK state is
// shared by the connection), and no HBONE peer sends more than a few
// hundred bytes. A malformed field makes the block a stream error.

// headerBlock is a complete, decoded header block.
type headerBlock struct {
	stream    uint32
	endStream bool
	fields    []hpack.HeaderField
	// malformed says why the block is not a valid request or response:
	// a stream error (RFC 9113 §8.1.1).
	malformed error
}

// errHeaderListSize is a block past MaxHeaderList.
var errHeaderListSize = fmt.Errorf("%w: header block larger than %d bytes", ErrProtocol, MaxHeaderList)

// headerReader decodes header blocks; the read loop owns it.
type headerReader struct {
	dec *hpack.Decoder
	// The block being read, from a HEADERS frame to its END_HEADERS.
	block      headerBlock
	encoded    int // fragment bytes so far
	size       int // decoded size so far (RFC 9113 §6.5.2)
	sawRegular bool
	pseudos    map[string]bool
}

func newHeaderReader() *headerReader {
	h := &headerReader{pseudos: map[string]bool{}}
	h.dec = hpack.NewDecoder(4096, h.field)
	h.dec.SetMaxStringLength(MaxHeaderList)
	return h
}

// headers starts a block; it returns the block when the frame ends it.
func (h *headerReader) headers(f *http2.HeadersFrame) (*headerBlock, error) {
	h.block = headerBlock{stream: f.StreamID, endStream: f.StreamEnded()}
	h.encoded, h.size, h.sawRegular = 0, 0, false
	clear(h.pseudos)
	h.dec.SetEmitEnabled(true)
	return h.fragment(f.HeaderBlockFragment(), f.HeadersEnded())
}

// continuation continues the open block (the Framer has checked that
// one is open, on this stream).
func (h *headerReader) continuation(f *http2.ContinuationFrame) (*headerBlock, error) {
	return h.fragment(f.HeaderBlockFragment(), f.HeadersEnded())
}

func (h *headerReader) fragment(frag []byte, end bool) (*headerBlock, error) {
	h.encoded += len(frag)
	if h.encoded > MaxHeaderList {
		return nil, errHeaderListSize
	}
	if _, err := h.dec.Write(frag); err != nil {
		return nil, fmt.Errorf("%w: %w", http2.ConnectionError(http2.ErrCodeCompression), err)
	}
	if h.size > MaxHeaderList {
		return nil, errHeaderListSize
	}
	if !end {
		return nil, nil
	}
	if err := h.dec.Close(); err != nil {
		return nil, fmt.Errorf("%w: %w", http2.ConnectionError(http2.ErrCodeCompression), err)
	}
	b := h.block
	h.block = headerBlock{}
	return &b, nil
}

// field receives a decoded field.
func (h *headerReader) field(f hpack.HeaderField) {
	h.size += int(f.Size())
	if h.size > MaxHeaderList || h.block.malformed != nil {
		// Decoding goes on for the HPACK state; the fields are dropped.
		h.dec.SetEmitEnabled(false)
		return
	}
	if err := checkField(f, h.sawRegular, h.pseudos); err != nil {
		h.block.malformed = err
		h.dec.SetEmitEnabled(false)
		return
	}
	if f.IsPseudo() {
		h.pseudos[f.Name] = true
	} else {
		h.sawRegular = true
	}
	h.block.fields = append(h.block.fields, f)
}

// checkField reports why f cannot be part of a well-formed block
// (RFC 9113 §8.2, §8.3).
func checkField(f hpack.HeaderField, sawRegular bool, pseudos map[string]bool) error {
	if !httpguts.ValidHeaderFieldValue(f.Value) {
		return fmt.Errorf("invalid value for header %q", f.Name)
	}
	if f.IsPseudo() {
		switch {
		case sawRegular:
			return fmt.Errorf("pseudo-header %s after a regular header", f.Name)
		case pseudos[f.Name]:
			return fmt.Errorf("pseudo-header %s repeated", f.Name)
		}
		switch f.Name {
		case ":method", ":authority", ":scheme", ":path", ":protocol", ":status":
			return nil
		}
		return fmt.Errorf("unknown pseudo-header %s", f.Name)
	}
	if f.Name == "" || strings.ContainsFunc(f.Name, func(r rune) bool { return !httpguts.IsTokenRune(r) || 'A' <= r && r <= 'Z' }) {
		return errors.New("invalid header name")
	}
	return nil
}
