package hbone

import (
	"errors"
	"io"
	"net"
)

// halfCloser is a connection whose write side closes alone.
type halfCloser interface {
	CloseWrite() error
}

// Splice carries bytes both ways between a TCP connection and a stream
// until both directions end, passing each end-of-stream on as a
// half-close, and reports the bytes each way (sent: conn to stream).
func Splice(c net.Conn, s *Stream) (sent, received int64, err error) {
	errc := make(chan error, 1)
	go func() {
		n, err := s.ReadFrom(c) // conn -> stream
		sent = n
		errc <- errors.Join(err, s.CloseWrite())
	}()
	received, rerr := s.WriteTo(c) // stream -> conn
	if hc, ok := c.(halfCloser); ok {
		_ = hc.CloseWrite()
	} else {
		_ = c.Close()
	}
	werr := <-errc
	_ = s.Close()
	_ = c.Close()
	if errors.Is(rerr, io.EOF) {
		rerr = nil
	}
	return sent, received, errors.Join(werr, rerr)
}
