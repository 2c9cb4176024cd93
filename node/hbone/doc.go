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
package hbone
