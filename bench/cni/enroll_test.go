// Package cni_test benchmarks pod enrollment on real network namespaces:
// rules in place (per backend), the pod IP in the host probe set, and the
// node proxy's ZDS Ack, for 200 pods; and a CNI ADD served by the agent
// while reconcile passes run (add_test.go). Run as root:
//
//	go test ./bench/cni -run '^$' -bench . -benchtime 3x
package cni_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/canopy-mesh/canopy/cni/hostrules"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

const pods = 200

// fixture is 200 pod namespaces, a node namespace for the host rules, and
// a ZDS server with a node proxy that acknowledges everything.
type fixture struct {
	pods []string
	// newcomers are more pod namespaces, for pods enrolled while the
	// others are.
	newcomers []string
	host      hostrules.Rules
	server    *zds.Server
}

func setup(b *testing.B) *fixture {
	b.Helper()
	nettest.NeedRoot(b)
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	prefix := "cnp-bench-" + hex.EncodeToString(id)
	f := &fixture{}
	// Each namespace has lo and, like a pod's, an interface with an
	// address (one end of a veth pair whose other end stays in the
	// namespace: no traffic flows here), which the eBPF backend attaches
	// its inbound program to.
	mk := func(name string, addr netip.Addr) string {
		path, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = netns.DeletePath(path) })
		h, err := netlink.NewHandleAt(mustNs(b, path))
		if err != nil {
			b.Fatal(err)
		}
		defer h.Close()
		lo, _ := h.LinkByName("lo")
		_ = h.LinkSetUp(lo)
		eth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}
		if err := h.LinkAdd(eth); err != nil {
			b.Fatal(err)
		}
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			b.Fatal(err)
		}
		if err := h.LinkSetUp(eth); err != nil {
			b.Fatal(err)
		}
		return path
	}
	for i := range pods {
		f.pods = append(f.pods, mk(fmt.Sprintf("%s-%d", prefix, i), podIP(i)))
	}
	for i := range newcomers {
		f.newcomers = append(f.newcomers, mk(fmt.Sprintf("%s-new-%d", prefix, i), netip.AddrFrom4([4]byte{10, 218, 0, byte(i)})))
	}
	f.host = hostrules.Rules{ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: mk(prefix+"-node", netip.AddrFrom4([4]byte{10, 217, 0, 1}))}
	if err := f.host.Sync(nil); err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "ztunnel.sock")
	f.server = zds.New(sock, zds.Config{}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go func() { _ = f.server.Run(ctx) }()
	go ackAll(ctx, sock)
	for f.server.Connected() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	return f
}

func mustNs(b *testing.B, path string) vnetns.NsHandle {
	h, err := vnetns.GetFromPath(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h
}

// ackAll is a node proxy that acknowledges every request.
func ackAll(ctx context.Context, sock string) {
	var uc *net.UnixConn
	var err error
	for uc, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"}); err != nil; uc, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"}) {
		time.Sleep(5 * time.Millisecond)
	}
	c := zdsconn.New(uc)
	go func() { <-ctx.Done(); c.Close() }()
	_ = c.Send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil, time.Now().Add(time.Second))
	for {
		var req zdspb.WorkloadRequest
		fds, err := c.Recv(&req, time.Time{})
		if err != nil {
			return
		}
		for _, f := range fds {
			f.Close()
		}
		if c.Send(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{}}}, nil, time.Now().Add(time.Second)) != nil {
			return
		}
	}
}

// podIP is the address of the i-th pod.
func podIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 219, byte(i >> 8), byte(i)}) }

// enroll is the agent's path for one pod after the plugin's ADD.
func (f *fixture) enroll(b *testing.B, backend redirect.Backend, i int, withRules bool) time.Duration {
	ip := podIP(i)
	nsf, err := os.Open(f.pods[i])
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if withRules {
		if err := backend.Enroll(f.pods[i], redirect.DefaultPodConfig()); err != nil {
			b.Fatal(err)
		}
		if err := f.host.Add(ip); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.server.Add(zds.Pod{UID: fmt.Sprintf("uid-%d", i), Info: &zdspb.WorkloadInfo{Name: "p", Namespace: "ns", ServiceAccount: "sa"}, Netns: nsf}); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

func report(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkEnroll: rules, host probe set and ZDS Ack per pod, for each
// backend; ZDSOnly (the Ack alone) is the baseline.
func BenchmarkEnroll(b *testing.B) {
	for _, tt := range []struct {
		name    string
		backend redirect.Backend
	}{{"nftables", redirect.Nftables{}}, {"iptables", redirect.Iptables{}}, {"ebpf", nil}, {"ZDSOnly", nil}} {
		b.Run(tt.name, func(b *testing.B) {
			f := setup(b)
			if tt.name == "ebpf" {
				tt.backend = redirect.Ebpf{Root: bpffs(b)}
			}
			var took []time.Duration
			for b.Loop() {
				for i := range pods {
					took = append(took, f.enroll(b, tt.backend, i, tt.backend != nil))
				}
				b.StopTimer()
				for i := range pods {
					if tt.backend != nil {
						_ = tt.backend.Unenroll(f.pods[i])
					}
					_ = f.server.Delete(fmt.Sprintf("uid-%d", i))
				}
				b.StartTimer()
			}
			report(b, took)
		})
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

// BenchmarkPluginExec is the container runtime's cost of running the
// plugin binary (CNI VERSION: exec, load, answer), which a real ADD adds
// to the enrollment above, with one HTTP round trip to the agent.
func BenchmarkPluginExec(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "canopy-cni")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/canopy-cni").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	var took []time.Duration
	for b.Loop() {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
		start := time.Now()
		if out, err := cmd.Output(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		took = append(took, time.Since(start))
	}
	report(b, took)
}
