package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// silentControlPlane never answers a lookup.
type silentControlPlane struct{ asked chan string }

func (s silentControlPlane) Lookup(ctx context.Context, key string) (bool, error) {
	s.asked <- key
	<-ctx.Done()
	return false, ctx.Err()
}

// TestOnDemandFailsClosed: in on-demand mode a destination the table does
// not hold is looked up, and when no answer comes in time the connection
// is refused. It used to be sent as plain TCP (unknown meant "outside
// the mesh"), which a PERMISSIVE mesh pod accepted: mTLS silently lost.
func TestOnDemandFailsClosed(t *testing.T) {
	asked := make(chan string, 16)
	// Configured before the proxy serves, as its main does: its pods'
	// goroutines read these.
	m := newMesh(t, "10.223.0.0/24", func(p *Proxy) {
		p.OnDemand, p.LookupTimeout = silentControlPlane{asked}, 200*time.Millisecond
	})
	// The client's proxy has not looked the server up yet.
	m.table.Apply(workloadapi.AddressTypeURL, nil, []string{"s"})
	refused := m.proxy.metrics.refused.WithLabelValues(reasonLookupFailed)
	before, plain := testutil.ToFloat64(refused), packets(t, m.serverNS, 8080)

	if got, _ := m.call(t); got != "" {
		t.Errorf("the call got %q through without its destination known", got)
	}
	select {
	case key := <-asked:
		if want := workloadapi.IPKey("", m.pair.AddrB); key != want {
			t.Errorf("looked up %q, want %q", key, want)
		}
	default:
		t.Error("the destination was never looked up")
	}
	if n := packets(t, m.serverNS, 8080) - plain; n != 0 {
		t.Errorf("%d plaintext packets reached the server's app port", n)
	}
	if got := testutil.ToFloat64(refused) - before; got != 1 {
		t.Errorf("canopy_node_connections_refused_total{reason=%q} grew by %v, want 1", reasonLookupFailed, got)
	}
}
