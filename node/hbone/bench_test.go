package hbone

import (
	"context"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The benchmarks here measure the HTTP/2 layer alone, over loopback TCP
// without TLS: bench/hbone measures the whole path against its
// baselines, but on a shared machine its figures move more than a
// change to this layer does.

// cpu returns a function that reports the process's CPU time per
// operation since cpu was called: on a shared machine it moves less than
// ns/op, which counts the time other processes ran.
func cpu(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPair returns a client connected over loopback TCP to a server
// running handler.
func benchPair(b *testing.B, handler func(*Stream)) *ClientConn {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			Serve(nc, handler)
		}
	}()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	cc, err := NewClientConn(nc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return cc
}

// BenchmarkStreamThroughput sends through one stream in writes of the
// given size; the server reads with WriteTo, as Splice does.
func BenchmarkStreamThroughput(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 10, 1 << 10} {
		b.Run(byteSize(size), func(b *testing.B) {
			cc := benchPair(b, func(s *Stream) {
				_ = s.Respond(200, nil)
				_, _ = io.Copy(io.Discard, s)
				_ = s.CloseWrite()
			})
			s, err := cc.Connect(context.Background(), "10.0.0.1:80", nil)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			report := cpu(b)
			for b.Loop() {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			report()
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s)
		})
	}
}

// BenchmarkStreamRoundTrip is one byte each way on an open stream.
func BenchmarkStreamRoundTrip(b *testing.B) {
	cc := benchPair(b, func(s *Stream) {
		_ = s.Respond(200, nil)
		buf := make([]byte, 1)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	})
	s, err := cc.Connect(context.Background(), "10.0.0.1:80", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	buf := make([]byte, 1)
	b.ReportAllocs()
	report := cpu(b)
	for b.Loop() {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			b.Fatal(err)
		}
	}
	report()
}

// BenchmarkConnect opens and closes a stream per operation.
func BenchmarkConnect(b *testing.B) {
	cc := benchPair(b, func(s *Stream) {
		_ = s.Respond(200, nil)
		_, _ = io.Copy(io.Discard, s)
		_ = s.CloseWrite()
	})
	b.ReportAllocs()
	report := cpu(b)
	defer report()
	for b.Loop() {
		s, err := cc.Connect(context.Background(), "10.0.0.1:80", nil)
		if err != nil {
			b.Fatal(err)
		}
		_ = s.CloseWrite()
		_, _ = io.Copy(io.Discard, s)
		s.Close()
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
