// Package dns_test measures the node proxy's DNS server (node/dns) against
// CoreDNS in the same run, on real network namespaces: a pod namespace
// with the CNI agent's capture rules (nftables, DNS capture on) and, on
// the other end of a veth pair, CoreDNS, the pod's resolver.
//
//   - coredns: the pod asks CoreDNS straight (its socket carries the
//     proxy's mark, which the capture lets pass), as a pod without the
//     DNS proxy does;
//   - proxy: the pod asks the same address; the capture sends the query
//     to the node proxy's server on the pod's 127.0.0.1:15053, which
//     answers mesh names itself and relays the rest to CoreDNS.
//
// Names of two kinds: mesh (1,000 Services; CoreDNS answers them from a
// hosts file, standing in for its kubernetes plugin's index, the proxy
// from its workload table) and forwarded (names outside the mesh, which
// CoreDNS answers from a template and the proxy relays). Each is asked
// by 1 client (latency: p50, p99) and by 16 at once (queries/s).
// BenchmarkMemoryPerPod is what the DNS server holds per served pod.
//
// Run as root, with CoreDNS from the test-reference tools:
//
//	go test ./bench/dns -run '^$' -bench . -benchtime 20000x
//
// and compare each proxy figure with the coredns one of the same run.
package dns_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	mdns "github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/tools"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/dns"
	"github.com/canopy-mesh/canopy/node/dns/upstream"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
)

const (
	services = 1000
	names    = 1000 // forwarded names asked in turn
)

func meshName(i int) string { return fmt.Sprintf("svc-%d.bench.svc.cluster.local.", i) }
func meshIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(1 + i%250)})
}
func forwardedName(i int) string { return fmt.Sprintf("host-%d.example.com.", i) }

// fixture is a pod namespace (A) whose DNS the proxy serves, and CoreDNS
// on B:53.
type fixture struct {
	pod     string
	resolve string // CoreDNS, B:53
}

func setup(b *testing.B) *fixture {
	b.Helper()
	nettest.NeedRoot(b)
	dir, err := tools.Dir("coredns")
	if err != nil {
		b.Skipf("CoreDNS: %v", err)
	}
	pair := nettest.NewPair(b, netip.MustParsePrefix("10.239.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		b.Fatal(err)
	}
	f := &fixture{pod: pair.A, resolve: netip.AddrPortFrom(pair.AddrB, 53).String()}
	startCoreDNS(b, filepath.Join(dir, "coredns"), pair.B, pair.AddrB)

	tbl := workloadtable.New()
	var rs []*discoveryv3.Resource
	for i := range services {
		a := &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: fmt.Sprintf("svc-%d", i), Namespace: "bench", Hostname: strings.TrimSuffix(meshName(i), "."),
			Addresses: []*workloadapi.NetworkAddress{{Address: meshIP(i).AsSlice()}},
		}}}
		v, err := proto.Marshal(a)
		if err != nil {
			b.Fatal(err)
		}
		rs = append(rs, &discoveryv3.Resource{Name: workloadapi.ResourceName(a), Resource: &anypb.Any{TypeUrl: workloadapi.AddressTypeURL, Value: v}})
	}
	if rej := tbl.Apply(workloadapi.AddressTypeURL, rs, nil); rej != nil {
		b.Fatal(workloadtable.JoinRejections(rej))
	}
	coredns := netip.AddrPortFrom(pair.AddrB, 53)
	srv, err := dns.New(dns.Config{Table: tbl, Upstreams: func(pod *inpod.Pod) (dns.Upstream, error) {
		fwd, err := upstream.NewForwarder(upstream.ForwarderConfig{Nameservers: []netip.AddrPort{coredns}, Dial: pod.Dial}, nil)
		return dns.Upstream{Forwarder: fwd, Final: true}, err
	}})
	if err != nil {
		b.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		b.Fatal(err)
	}
	pod, err := inpod.OpenWith(ns, inpod.Options{DNS: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pod.Close() })
	srv.ServePod(pod, &workloadapi.Workload{Uid: "bench-client", Namespace: "bench", Name: "client"})
	return f
}

// startCoreDNS runs CoreDNS inside the namespace at path, on addr:53, and
// waits until it answers.
func startCoreDNS(b *testing.B, bin, path string, addr netip.Addr) {
	b.Helper()
	dir := b.TempDir()
	var hosts strings.Builder
	for i := range services {
		fmt.Fprintf(&hosts, "%s %s\n", meshIP(i), strings.TrimSuffix(meshName(i), "."))
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	// Both zones answer with a 30 s TTL, as the proxy does; no cache, no
	// logging, so each query is answered anew on both paths.
	corefile := fmt.Sprintf(`cluster.local:53 {
    bind %[1]s
    hosts %[2]s {
        ttl 30
        no_reverse
    }
}
example.com:53 {
    bind %[1]s
    template IN A {
        answer "{{ .Name }} 30 IN A 192.0.2.10"
    }
    template IN AAAA {
        rcode NOERROR
    }
}
`, addr, filepath.Join(dir, "hosts"))
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-conf", conf)
	out, err := os.Create(filepath.Join(dir, "coredns.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// A process started inside the namespace is born in it.
	if err := netns.Do(path, cmd.Start); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); out.Close() })
	c := dial(b, path, netip.AddrPortFrom(addr, 53).String(), true)
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := exchange(c, meshName(0), mdns.TypeA); err == nil {
			return
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(out.Name())
			b.Fatalf("CoreDNS does not answer: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dial opens a UDP socket in the pod namespace connected to addr; marked,
// it passes the capture and reaches addr itself.
func dial(b *testing.B, path, addr string, marked bool) *mdns.Conn {
	b.Helper()
	d := net.Dialer{}
	if marked {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, inpod.Mark) }); err != nil {
				return err
			}
			return serr
		}
	}
	return nettest.In(b, path, func() (*mdns.Conn, error) {
		c, err := d.Dial("udp", addr)
		if err != nil {
			return nil, err
		}
		return &mdns.Conn{Conn: c}, nil
	})
}

// exchange asks name and checks the answer is a NOERROR with a record.
func exchange(c *mdns.Conn, name string, qtype uint16) (time.Duration, error) {
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	start := time.Now()
	_ = c.SetDeadline(start.Add(2 * time.Second))
	if err := c.WriteMsg(q); err != nil {
		return 0, err
	}
	for {
		r, err := c.ReadMsg()
		if err != nil {
			return 0, err
		}
		if r.Id != q.Id {
			continue // a late answer to an earlier, timed-out query
		}
		if r.Rcode != mdns.RcodeSuccess || len(r.Answer) == 0 {
			return 0, fmt.Errorf("%s: rcode %s, %d answers", name, mdns.RcodeToString[r.Rcode], len(r.Answer))
		}
		return time.Since(start), nil
	}
}

// BenchmarkQueries: queries/s and latency through the proxy and straight
// to CoreDNS, for mesh and forwarded names.
func BenchmarkQueries(b *testing.B) {
	f := setup(b)
	for _, kind := range []struct {
		name  string
		asked func(i int) string
	}{{"mesh", func(i int) string { return meshName(i % services) }}, {"forwarded", func(i int) string { return forwardedName(i % names) }}} {
		for _, path := range []struct {
			name   string
			marked bool
		}{{"coredns", true}, {"proxy", false}} {
			for _, clients := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%s/clients=%d", kind.name, path.name, clients), func(b *testing.B) {
					conns := make([]*mdns.Conn, clients)
					for i := range conns {
						conns[i] = dial(b, f.pod, f.resolve, path.marked)
						defer conns[i].Close()
					}
					took := make([][]time.Duration, clients)
					errs := make([]error, clients)
					var wg sync.WaitGroup
					b.ResetTimer()
					start := time.Now()
					for w := range clients {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := w; i < b.N; i += clients {
								d, err := exchange(conns[w], kind.asked(i), mdns.TypeA)
								if err != nil {
									errs[w] = err
									return
								}
								took[w] = append(took[w], d)
							}
						}()
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					if err := errors.Join(errs...); err != nil {
						b.Fatal(err)
					}
					all := slices.Concat(took...)
					slices.Sort(all)
					b.ReportMetric(float64(len(all))/elapsed.Seconds(), "queries/s")
					b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
				})
			}
		}
	}
}

// BenchmarkMemoryPerPod: the heap, stacks and goroutines the DNS server
// holds per served pod (its serving goroutines, their buffers), over 100
// pods; the kernel's socket buffers are not counted.
func BenchmarkMemoryPerPod(b *testing.B) {
	nettest.NeedRoot(b)
	const pods = 100
	tbl := workloadtable.New()
	srv, err := dns.New(dns.Config{Table: tbl, Upstreams: func(*inpod.Pod) (dns.Upstream, error) {
		return dns.Upstream{}, errors.New("no resolvers in this benchmark")
	}})
	if err != nil {
		b.Fatal(err)
	}
	var paths []string
	for i := range pods {
		path, err := netns.Create(fmt.Sprintf("cnp-bench-dns-%d-%d", os.Getpid(), i))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = netns.DeletePath(path) })
		paths = append(paths, path)
	}
	// Each pod's DNS sockets are opened before the measure: what is
	// counted is the serving.
	open := func() []*inpod.Pod {
		var out []*inpod.Pod
		for _, path := range paths {
			ns, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			p, err := inpod.OpenWith(ns, inpod.Options{DNS: true})
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, p)
		}
		return out
	}
	// One measure whatever b.N: a second would count the first's
	// garbage.
	opened := open()
	heap0, g0 := inUse(), runtime.NumGoroutine()
	for i, p := range opened {
		srv.ServePod(p, &workloadapi.Workload{Uid: fmt.Sprint("pod-", i), Namespace: "bench", Name: fmt.Sprint("pod-", i)})
	}
	time.Sleep(100 * time.Millisecond) // the serving goroutines start
	heap1, g1 := inUse(), runtime.NumGoroutine()
	b.ReportMetric(float64(heap1-heap0)/pods, "bytes/pod")
	b.ReportMetric(float64(g1-g0)/pods, "goroutines/pod")
	for _, p := range opened {
		_ = p.Close()
	}
}

// inUse is the live heap and the goroutine stacks.
func inUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}
