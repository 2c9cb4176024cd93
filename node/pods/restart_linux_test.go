package pods

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/node/zdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// acceptor stands in for the proxy: it accepts on the pod's outbound
// listener and counts.
type acceptor struct{ outbound atomic.Int32 }

func (a *acceptor) ServePod(p *inpod.Pod, _ *workloadapi.Workload) {
	go func() {
		for {
			c, err := p.Outbound.Accept()
			if err != nil {
				return
			}
			a.outbound.Add(1)
			c.Close()
		}
	}()
}

// TestRestartHealsFromTheSnapshot: a node proxy restart leaves the pod
// failing closed (its traffic is refused, never sent around the proxy),
// and the new proxy serves the pod again from the agent's snapshot, with
// no re-enrollment.
func TestRestartHealsFromTheSnapshot(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.223.0.0/24"))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	sock := filepath.Join(t.TempDir(), "ztunnel.sock")
	agent := zds.New(sock, zds.Config{}, log)
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	_ = agent.Add(zds.Pod{UID: "p1", Info: &zdspb.WorkloadInfo{Name: "web-1", Namespace: "apps", ServiceAccount: "web"}, Netns: ns})
	actx, acancel := context.WithCancel(context.Background())
	defer acancel()
	go func() { _ = agent.Run(actx) }()
	ws := workloads{{Uid: "w", Name: "web-1", Namespace: "apps", ServiceAccount: "web", Node: "n1"}}

	start := func() (*acceptor, *Set, func()) {
		acc := &acceptor{}
		set := &Set{Node: "n1", Workloads: ws, Certs: &certs{ids: map[workloadapi.Identity]int{}}, Server: acc, Log: log}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = zdsclient.Client{Path: sock, Handler: set, Log: log}.Run(ctx) }()
		return acc, set, func() { cancel(); <-done; set.Close() }
	}
	appDial := func() bool {
		var ok bool
		nettest.In(t, pair.A, func() (struct{}, error) {
			c, err := net.DialTimeout("tcp4", pair.AddrB.String()+":80", time.Second)
			if err == nil {
				ok = true
				c.Close()
			}
			return struct{}{}, nil
		})
		return ok
	}
	first, _, stop := start()
	eventually.True(t, "the first proxy serves the pod", func() bool { return appDial() && first.outbound.Load() > 0 })
	stop()
	if appDial() {
		t.Fatal("with no proxy the pod's traffic got through: it must fail closed")
	}
	second, _, stop2 := start()
	defer stop2()
	eventually.True(t, "the restarted proxy serves the pod from the snapshot", func() bool { return appDial() && second.outbound.Load() > 0 })
}
