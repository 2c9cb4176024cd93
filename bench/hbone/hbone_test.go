// Package hbone_test measures the HBONE data path against the baselines
// the node proxy must beat, on loopback:
//
//   - direct: client to server TCP;
//   - tls: a plain per-connection mutual-TLS tunnel pair (TCP -> TLS ->
//     TCP), the simplest secure tunnel;
//   - hbone: TCP -> HBONE stream over one pooled mTLS HTTP/2 connection
//     -> TCP, the node proxy's path.
//
// The tunnels' two ends run in the benchmark's process; the load
// generator and the servers (a sink, an echo) each in a process of its
// own (roles_test.go), so that the figures, the CPU profile
// (-cpuprofile) and the memory per connection are the tunnels' alone.
// Each benchmark reports every path of one run, direct first; tls and
// hbone also report themselves against direct of the same run (x-direct,
// added-p50-µs, added-p99-µs), the figures to compare across runs:
//
//	go test ./bench/hbone -run '^$' -bench . -benchtime 1x
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

// path is a way from the client to a server: the address the client
// dials.
type path struct {
	name string
	addr string
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
	return []path{{"direct", target}, {"tls", tlsClient}, {"hbone", hboneClient}}
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

// streamBytes is what each stream benchmark moves through a path in all.
const streamBytes = 2 << 30

// BenchmarkThroughput streams through each path with 1 and 8 parallel
// connections, each moving the same bytes: MB/s in all, each stream's rate
// against the streams' mean (the lowest and the highest; 1 when fair), and
// the CPU the tunnels spent per GB.
func BenchmarkThroughput(b *testing.B) {
	sinkAddr, _ := servers(b)
	for _, streams := range []int{1, 8} {
		var direct float64 // MB/s of the direct path, measured first
		for _, p := range paths(b, sinkAddr) {
			b.Run(fmt.Sprintf("%s/streams=%d", p.name, streams), func(b *testing.B) {
				var r result
				cpu0 := cpuTime()
				for b.Loop() {
					r = load{Mode: "stream", Addr: p.addr, Streams: streams, Bytes: streamBytes}.run(b)
				}
				cpu := cpuTime() - cpu0
				var total int64
				for _, n := range r.StreamBytes {
					total += n
				}
				mbps := float64(total) / r.Seconds / 1e6
				b.ReportMetric(mbps, "MB/s")
				if p.name == "direct" {
					direct = mbps
				} else if direct > 0 {
					b.ReportMetric(mbps/direct, "x-direct")
				}
				rates := make([]float64, streams)
				var mean float64
				for i := range rates {
					rates[i] = float64(r.StreamBytes[i]) / r.StreamSeconds[i]
					mean += rates[i] / float64(streams)
				}
				b.ReportMetric(slices.Min(rates)/mean, "min-rate/mean")
				b.ReportMetric(slices.Max(rates)/mean, "max-rate/mean")
				// The tunnels' CPU (this process holds nothing else) per GB.
				b.ReportMetric(cpu.Seconds()/float64(b.N)/(float64(total)/1e9), "tunnel-cpu-s/GB")
			})
		}
	}
}

// BenchmarkRequestResponse: small requests and responses on one warm
// connection through each path, 20,000 round trips: p50 and p99.
func BenchmarkRequestResponse(b *testing.B) {
	_, echoAddr := servers(b)
	for _, size := range []int{1, 1024} {
		var direct result // measured first
		for _, p := range paths(b, echoAddr) {
			b.Run(fmt.Sprintf("%s/size=%d", p.name, size), func(b *testing.B) {
				var r result
				for b.Loop() {
					r = load{Mode: "rr", Addr: p.addr, Size: size, N: 20000}.run(b)
				}
				b.ReportMetric(float64(r.P50.Microseconds()), "p50-µs")
				b.ReportMetric(float64(r.P99.Microseconds()), "p99-µs")
				if p.name == "direct" {
					direct = r
				} else if direct.P99 > 0 {
					// What the path adds to a round trip.
					b.ReportMetric(float64((r.P50 - direct.P50).Microseconds()), "added-p50-µs")
					b.ReportMetric(float64((r.P99 - direct.P99).Microseconds()), "added-p99-µs")
				}
			})
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewConnections: 5,000 new connections one after another (one
// byte each way, then close) through each path, over a warm HBONE pool.
func BenchmarkNewConnections(b *testing.B) {
	_, echoAddr := servers(b)
	var direct float64 // conns/s of the direct path, measured first
	for _, p := range paths(b, echoAddr) {
		b.Run(p.name, func(b *testing.B) {
			const n = 5000
			var r result
			for b.Loop() {
				r = load{Mode: "connect", Addr: p.addr, N: n}.run(b)
			}
			rate := n / r.Seconds
			b.ReportMetric(rate, "conns/s")
			if p.name == "direct" {
				direct = rate
			} else if direct > 0 {
				b.ReportMetric(rate/direct, "x-direct")
			}
		})
	}
}

// BenchmarkIdleMemory: heap and stacks per idle connection held through
// each path, 1,000 connections, in this process: the tunnels' two ends
// alone (the client and the server are processes of their own).
func BenchmarkIdleMemory(b *testing.B) {
	_, echoAddr := servers(b)
	for _, p := range paths(b, echoAddr) {
		b.Run(p.name, func(b *testing.B) {
			const n = 1000
			for b.Loop() {
				before := inUse()
				release := load{Mode: "hold", Addr: p.addr, N: n}.hold(b)
				b.ReportMetric(float64(inUse()-before)/n, "bytes/conn")
				release()
				// Let the tunnels' goroutines end before the next path is
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
