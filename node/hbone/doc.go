// Package hbone is HBONE (docs/wire-contract.md §5.3): TCP streams carried as
// HTTP/2 CONNECT streams over one mutual-TLS connection, both the client (a
// node proxy sending a pod's connection) and the server (15008 in a pod).
//
// It speaks HTTP/2 through golang.org/x/net/http2's Framer and HPACK but
// not its Transport or Server: those move stream bytes through io.Pipe,
// per-request goroutines and small frames, which is what makes a naive
// HBONE a fraction of plain TCP. Here a connection has one reader
// goroutine that appends DATA to per-stream buffers sized by the windows
// (4 MiB per stream, 16 MiB per connection, frames up to 1 MiB, as
// ztunnel), window updates are batched, and writers share one buffered
// writer that the last writer in flushes, so concurrent streams coalesce
// into large TLS records.
//
// # Idle connections
//
// Splice, which carries a TCP connection over a stream at either end,
// holds no buffer while the connection is idle and one goroutine, its
// caller's: it waits for the app's socket to be readable without a
// buffer (sink.go, read_linux.go), and the stream's direction has no
// goroutine of its own, the read loop writing received DATA to the app's
// socket with a non-blocking write (a goroutine starts only for what the
// socket does not take at once). Both ends together hold about 11 KiB
// per idle connection, 8 KiB of it the two callers' stacks
// (TestIdleStreamsAreCheap).
//
// # Hostile peers
//
// Either end may be an attacker with a valid certificate, so a
// connection holds its peer to Limits (DefaultLimits unless ServeWith or
// NewClientConnWith say otherwise), on the client as on the server:
//
//   - Memory follows bytes, not frames: DATA fills the tail of a stream's
//     buffer before a new one is taken, buffers come in power-of-two
//     sizes (16 KiB to 1 MiB), and what a stream holds is bounded by its
//     window. Header blocks stop at MaxHeaderList (16 KiB), encoded or
//     decoded (PROTOCOL_ERROR); a SETTINGS frame at 100 parameters
//     (PROTOCOL_ERROR), each applied once.
//   - Streams: at most Limits.MaxStreams open and, on the server, at
//     most that many handlers running; a handler holds its slot until it
//     returns, so resetting a stream does not free it. Past the limit a
//     stream is refused (REFUSED_STREAM).
//   - Rates: stream resets (the peer's RST_STREAM, and streams refused or
//     reset for its errors), PING and SETTINGS frames are token buckets
//     (Limits.Resets, Pings, Settings); frames without payload may not
//     follow one another (Limits.MaxEmptyFrames).
//   - The read loop never writes to the socket: its answers (PING and
//     SETTINGS acknowledgements, resets, window updates, those for DATA
//     it wrote through to an app) wait in a queue of at most
//     Limits.MaxControlQueue frames, which only a peer that does not read
//     fills. Its writes to an app's socket never wait: what the socket
//     does not take at once is queued within the stream's window.
//   - Before the TLS handshake: ServerTLS waits for the client's first
//     byte without any TLS state, and the buffer TLS records are batched
//     in is taken after the handshake, so a peer that connects and says
//     nothing costs a goroutine and a few KiB until the deadline
//     (TestSilentTLSPeersAreCheap); bounding how many such peers there
//     are is the caller's.
//   - Time: the preface and first SETTINGS (Limits.HandshakeTimeout), a
//     connection without streams (IdleTimeout, GOAWAY NO_ERROR), a
//     CONNECT's answer (ConnectTimeout), a write making no progress
//     (WriteTimeout), the TLS handshake when the caller's context has no
//     deadline (TLSHandshakeTimeout), and a Stream's own deadlines
//     (SetDeadline).
//
// A peer past a limit gets GOAWAY with ENHANCE_YOUR_CALM and the
// connection ends with an error wrapping ErrEnhanceYourCalm (ErrFlood,
// ErrTooManyResets); a peer breaking HTTP/2 gets PROTOCOL_ERROR (or
// FLOW_CONTROL_ERROR) and ErrProtocol. The GOAWAY write is bounded, so a
// peer that does not read is not waited for.
//
// # Concurrency
//
// ClientConn, ServerConn and Stream are safe for concurrent use; as with
// a net.Conn, a Stream is read in one goroutine (Read, WriteTo) while
// written in another (Write, ReadFrom). A server handler runs in its own
// goroutine per stream.
package hbone
