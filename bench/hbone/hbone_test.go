// Package hbone_test measures the HBONE data path against the baselines
// the node proxy must beat, in one process on loopback:
//
//   - direct: client to server TCP;
//   - tls: a plain per-connection mutual-TLS tunnel pair (TCP -> TLS ->
//     TCP), the simplest secure tunnel;
//   - hbone: TCP -> HBONE stream over one pooled mTLS HTTP/2 connection
//     -> TCP, the node proxy's path.
//
// Run: go test ./bench/hbone -run '^$' -bench . -count 3
// and compare MB/s within one run.
package hbone_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
	"github.com/canopy-mesh/canopy/node/hbone"
)

func listen(b *testing.B, serve func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return l.Addr().String()
}

// sink discards what it reads and answers the byte count when the client
// half-closes.
func sink(c net.Conn) {
	defer c.Close()
	n, _ := io.Copy(io.Discard, c)
	fmt.Fprintf(c, "%d", n)
}

// path is a way from the client to the sink; dial opens one connection.
type path struct {
	name string
	dial func() (net.Conn, error)
}

// paths builds the three ways to target.
func paths(b *testing.B, target string) []path {
	scfg, ccfg := testcerts.MutualTLS(b, "bench")
	// tls: per-connection mTLS tunnel.
	tlsServer := listen(b, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		pipe(tls.Server(c, scfg), up)
	})
	tlsClient := listen(b, func(c net.Conn) {
		tc, err := tls.Dial("tcp", tlsServer, ccfg)
		if err != nil {
			c.Close()
			return
		}
		pipe(c, tc)
	})
	// hbone: one pooled connection, a stream per TCP connection.
	hboneServer := listen(b, func(c net.Conn) {
		tc, err := hbone.ServerTLS(context.Background(), c, scfg)
		if err != nil {
			return
		}
		hbone.Serve(tc, func(s *hbone.Stream) {
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = s.Respond(503, nil)
				return
			}
			_ = s.Respond(200, nil)
			_, _, _ = hbone.Splice(up, s)
		})
	})
	raw, err := net.Dial("tcp", hboneServer)
	if err != nil {
		b.Fatal(err)
	}
	nc, err := hbone.ClientTLS(context.Background(), raw, ccfg)
	if err != nil {
		b.Fatal(err)
	}
	cc, err := hbone.NewClientConn(nc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	hboneClient := listen(b, func(c net.Conn) {
		s, err := cc.Connect(context.Background(), target, nil)
		if err != nil {
			c.Close()
			return
		}
		_, _, _ = hbone.Splice(c, s)
	})
	dial := func(addr string) func() (net.Conn, error) {
		return func() (net.Conn, error) { return net.Dial("tcp", addr) }
	}
	return []path{{"direct", dial(target)}, {"tls", dial(tlsClient)}, {"hbone", dial(hboneClient)}}
}

// pipe copies both ways with half-closes.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 256<<10)
		_, _ = io.CopyBuffer(dst, src, buf)
		if hc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

const chunk = 1 << 20

// BenchmarkThroughput streams through each path with 1 and 8 parallel
// connections; MB/s is the figure (b.SetBytes per 1 MiB write).
func BenchmarkThroughput(b *testing.B) {
	for _, streams := range []int{1, 8} {
		for _, p := range paths(b, listen(b, sink)) {
			b.Run(fmt.Sprintf("%s/streams=%d", p.name, streams), func(b *testing.B) {
				conns := make([]net.Conn, streams)
				for i := range conns {
					c, err := p.dial()
					if err != nil {
						b.Fatal(err)
					}
					conns[i] = c
				}
				buf := make([]byte, chunk)
				b.SetBytes(chunk)
				cpu0 := cpuTime()
				b.ResetTimer()
				var wg sync.WaitGroup
				per := b.N / streams
				for i, c := range conns {
					n := per
					if i == 0 {
						n += b.N % streams
					}
					wg.Go(func() {
						for range n {
							if _, err := c.Write(buf); err != nil {
								b.Error(err)
								return
							}
						}
						_ = c.(*net.TCPConn).CloseWrite()
						_, _ = io.ReadAll(c) // the sink's count: everything arrived
						c.Close()
					})
				}
				wg.Wait()
				b.StopTimer()
				// CPU of the whole process (load, proxies, sink) per GB moved;
				// the path's own cost is this minus the direct path's.
				b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(b.N)*chunk/1e9), "cpu-s/GB")
			})
		}
	}
}

// BenchmarkRequestResponse: small request/response on a warm connection;
// ns/op is one round trip.
func BenchmarkRequestResponse(b *testing.B) {
	echoSrv := listen(b, func(c net.Conn) { _, _ = io.Copy(c, c) })
	for _, size := range []int{1, 1024} {
		for _, p := range paths(b, echoSrv) {
			b.Run(fmt.Sprintf("%s/size=%d", p.name, size), func(b *testing.B) {
				c, err := p.dial()
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				msg := make([]byte, size)
				var took []time.Duration
				for b.Loop() {
					start := time.Now()
					if _, err := c.Write(msg); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, msg); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewConnections: a new connection per operation (one byte each
// way, then close) over a warm HBONE pool; ns/op is one connection.
func BenchmarkNewConnections(b *testing.B) {
	echoSrv := listen(b, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
	for _, p := range paths(b, echoSrv) {
		b.Run(p.name, func(b *testing.B) {
			one := []byte{1}
			for b.Loop() {
				c, err := p.dial()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Write(one); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkIdleMemory: heap and stacks per idle proxied connection (both
// proxies of the path, in this process), 1,000 connections.
func BenchmarkIdleMemory(b *testing.B) {
	const n = 1000
	echoSrv := listen(b, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
	for _, p := range paths(b, echoSrv) {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				before := inUse()
				conns := make([]net.Conn, n)
				one := []byte{1}
				for i := range conns {
					c, err := p.dial()
					if err != nil {
						b.Fatal(err)
					}
					// A round trip: the connection is established end to end.
					_, _ = c.Write(one)
					_, _ = io.ReadFull(c, one)
					conns[i] = c
				}
				b.ReportMetric(float64(inUse()-before)/n, "bytes/conn")
				for _, c := range conns {
					c.Close()
				}
				// Let the proxies' goroutines end before the next path is
				// measured.
				time.Sleep(2 * time.Second)
			}
		})
	}
}

func inUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
