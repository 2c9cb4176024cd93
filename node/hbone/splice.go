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
// The stream's received bytes are Splice's alone: nothing else may read
// the stream meanwhile.
//
// An idle *net.TCPConn costs one goroutine (the caller's, waiting for
// the socket to be readable without a buffer) and no buffer (sink.go);
// other connections take a goroutine and a small buffer per direction.
func Splice(c net.Conn, s *Stream) (sent, received int64, err error) {
	if tc, ok := c.(*net.TCPConn); ok {
		if k, kerr := newAppSink(tc); kerr == nil {
			return spliceTCP(tc, k, s)
		}
	}
	return spliceCopy(c, s)
}

// spliceTCP is Splice for a TCP connection: the caller's goroutine
// carries the connection to the stream, the read loop (and a goroutine
// while the app is slower than the peer) the stream to the connection.
func spliceTCP(c *net.TCPConn, k *appSink, s *Stream) (sent, received int64, err error) {
	s.attachSink(k)
	sent, werr := s.readFromTCP(k)
	werr = errors.Join(werr, s.CloseWrite())
	<-k.done
	received, rerr := k.written.Load(), k.err
	_ = s.Close()
	_ = c.Close()
	return sent, received, errors.Join(werr, rerr)
}

// readFromTCP carries c's bytes to s until c's end; it holds a pooled
// buffer only while bytes are in it (readReady).
func (s *Stream) readFromTCP(k *appSink) (int64, error) {
	var total int64
	for {
		buf, n, err := k.readReady()
		if n > 0 {
			if _, werr := s.Write((*buf)[:n]); werr != nil {
				readBuffers.Put(buf)
				return total, werr
			}
			total += int64(n)
		}
		if buf != nil {
			readBuffers.Put(buf)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// spliceCopy is Splice for any connection: a goroutine per direction.
func spliceCopy(c net.Conn, s *Stream) (sent, received int64, err error) {
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
