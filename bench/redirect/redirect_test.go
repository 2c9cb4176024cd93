// Package redirect_test measures what each redirection backend costs a
// pod's connections through the node proxy, every backend in one run, on
// real network namespaces:
//
//   - direct: the client namespace dials the server namespace, neither
//     enrolled, no proxy: the floor;
//   - nftables, iptables, ebpf: both namespaces enrolled with the backend
//     and served by one node proxy (node/proxy, in-pod listeners); the
//     client's connection is captured to 15001, carried over HBONE with
//     mutual TLS to the server pod's 15008, and delivered to the app from
//     the client's address. The ebpf path's listeners are in the pods'
//     socket maps on a BPF filesystem the benchmark mounts.
//
// BenchmarkNewConnections is the cost of a connection (connect, one byte
// each way, close) and BenchmarkThroughput one stream's bytes. Compare each
// backend with nftables, the default, within one run. Run as root:
//
//	go test ./bench/redirect -run '^$' -bench . -benchtime 2000x
package redirect_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/caclient"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/node/proxy"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// The server app's ports: it echoes on one and discards on the other.
const (
	echoPort = 8080
	sinkPort = 8081
)

// signer signs with a real authority, as the CA would.
type signer struct{ auth *pki.Authority }

func (s signer) Sign(_ context.Context, csrPEM []byte, id workloadapi.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := s.auth.Sign(csr, id, ttl, time.Now())
	if err != nil {
		return nil, err
	}
	return caclient.ParseChain(chain)
}

// path is one way from the client namespace to the server app.
type path struct {
	name string
	// backend enrolls both namespaces; nil for direct.
	backend redirect.Backend
	// bpf: the backend pins on a BPF filesystem, which the setup mounts
	// and hands to the backend and the proxy's listeners, as a node's.
	bpf bool
}

func paths() []path {
	return []path{
		{name: "direct"},
		{name: "nftables", backend: redirect.Nftables{}},
		{name: "iptables", backend: redirect.Iptables{}},
		{name: "ebpf", backend: redirect.Ebpf{}, bpf: true},
	}
}

// bpffs mounts a BPF filesystem for the eBPF backend's pins, unmounted at
// the benchmark's end.
func bpffs(b *testing.B) string {
	b.Helper()
	if err := bpfprog.Probe(); err != nil {
		b.Skip(err)
	}
	return nettest.BPFFS(b)
}

// setup builds the pair of namespaces for p, with the server app echoing
// on echoPort and discarding on sinkPort, and returns the server's address
// and the client's namespace.
func setup(b *testing.B, p path, subnet string) (netip.Addr, string) {
	b.Helper()
	pair := nettest.NewPair(b, netip.MustParsePrefix(subnet))
	for port, serve := range map[int]func(net.Conn){echoPort: echo, sinkPort: sink} {
		app := nettest.In(b, pair.B, func() (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf(":%d", port)) })
		b.Cleanup(func() { app.Close() })
		go func() {
			for {
				c, err := app.Accept()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
	}
	if p.backend == nil {
		return pair.AddrB, pair.A
	}
	backend := p.backend
	var opts inpod.Options
	if p.bpf {
		opts.BPFRoot = bpffs(b)
		backend = redirect.Ebpf{Root: opts.BPFRoot}
	}
	cfg := redirect.DefaultPodConfig()
	cfg.DNSCapture = false
	for _, ns := range []string{pair.A, pair.B} {
		if err := backend.Enroll(ns, cfg); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = backend.Unenroll(ns) })
	}

	auth, err := pki.NewSelfSigned("cluster.local", 0, time.Now().Add(-time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	client, srv := workload("c", "client", pair.AddrA), workload("s", "server", pair.AddrB)
	table := workloadtable.New()
	table.Apply(workloadapi.AddressTypeURL, []*discoveryv3.Resource{
		resource(b, "c", client), resource(b, "s", srv),
	}, nil)
	log := slog.New(slog.DiscardHandler)
	certs, err := identity.New(identity.Config{}, signer{auth}, log)
	if err != nil {
		b.Fatal(err)
	}
	for _, w := range []*workloadapi.Workload{client, srv} {
		certs.Add(workloadapi.WorkloadIdentity(w))
	}
	px, err := proxy.New(table, certs, "Kubernetes", prometheus.NewRegistry(), log)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(px.Close)
	b.Cleanup(cancel)
	go px.Run(ctx)
	for _, x := range []struct {
		ns string
		w  *workloadapi.Workload
	}{{pair.A, client}, {pair.B, srv}} {
		f, err := os.Open(x.ns)
		if err != nil {
			b.Fatal(err)
		}
		pod, err := inpod.OpenWith(f, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pod.Close() })
		px.ServePod(pod, x.w)
	}
	// The first connection waits for the certificates.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dial(pair.A, netip.AddrPortFrom(pair.AddrB, echoPort))
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, err = c.Write([]byte{1})
			if err == nil {
				_, err = io.ReadFull(c, make([]byte, 1))
			}
			c.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: no connection through the proxy: %v", p.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return pair.AddrB, pair.A
}

func workload(uid, sa string, ip netip.Addr) *workloadapi.Workload {
	return &workloadapi.Workload{Uid: uid, Name: sa, Namespace: "bench", ServiceAccount: sa, Addresses: [][]byte{ip.AsSlice()},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY, TrustDomain: "cluster.local"}
}

func resource(b *testing.B, name string, w *workloadapi.Workload) *discoveryv3.Resource {
	m, err := proto.Marshal(&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
	if err != nil {
		b.Fatal(err)
	}
	return &discoveryv3.Resource{Name: name, Resource: &anypb.Any{TypeUrl: workloadapi.AddressTypeURL, Value: m}}
}

// dial connects from inside the namespace at ns; the socket keeps the
// namespace it was made in.
func dial(ns string, to netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", to.String(), 3*time.Second)
		return err
	})
	return c, err
}

// echo answers each byte it reads.
func echo(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(c, c)
}

// sink discards what it reads and closes when the client half-closes.
func sink(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(io.Discard, c)
}

// BenchmarkNewConnections: per operation a new connection from the client
// namespace, one byte there and back, and close.
func BenchmarkNewConnections(b *testing.B) {
	for i, p := range paths() {
		b.Run(p.name, func(b *testing.B) {
			addr, client := setup(b, p, fmt.Sprintf("10.241.%d.0/24", i))
			server := netip.AddrPortFrom(addr, echoPort)
			one := make([]byte, 1)
			start := time.Now()
			// The loop runs on a thread inside the client's namespace, so
			// each socket is made there without a switch per connection.
			err := netns.Do(client, func() error {
				for b.Loop() {
					c, err := net.DialTimeout("tcp", server.String(), 3*time.Second)
					if err != nil {
						return err
					}
					if _, err := c.Write(one); err != nil {
						return err
					}
					if _, err := io.ReadFull(c, one); err != nil {
						return err
					}
					c.Close()
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
		})
	}
}

// BenchmarkThroughput: one stream from the client namespace to the
// server app, 64 KiB writes; b.SetBytes makes go test print MB/s.
func BenchmarkThroughput(b *testing.B) {
	const chunk = 64 << 10
	for i, p := range paths() {
		b.Run(p.name, func(b *testing.B) {
			addr, client := setup(b, p, fmt.Sprintf("10.242.%d.0/24", i))
			c, err := dial(client, netip.AddrPortFrom(addr, sinkPort))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
