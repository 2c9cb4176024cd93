package proxy

import (
	"context"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/canopy-mesh/canopy/node/hbone"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestNoSelfLoop: every way of making the proxy connect to its own
// listeners is refused and counted. Each of these used to start a loop
// (the proxy dialling podIP:15001 with its mark reaches its own outbound
// listener, whose original destination is podIP:15001, and so on) that
// grew by thousands of goroutines and descriptors a second until the
// process ran out of them, taking every pod of the node down.
func TestNoSelfLoop(t *testing.T) {
	m := newMesh(t, "10.222.0.0/24")
	refused := m.proxy.metrics.refused.WithLabelValues(reasonSelfCall)
	a, b := m.pair.AddrA.String(), m.pair.AddrB.String()

	for _, tc := range []struct {
		name    string
		attempt func(t *testing.T)
	}{
		{"a pod to its own address on 15001", func(t *testing.T) {
			_, _ = m.send(t, m.clientNS, a+":15001", "loop")
		}},
		{"a pod to a peer's 15001, through its own proxy", func(t *testing.T) {
			_, _ = m.send(t, m.clientNS, b+":15001", "loop")
		}},
		{"plaintext from outside the mesh to a pod's 15001", func(t *testing.T) {
			// The proxy's mark lets the connection leave the client pod
			// uncaptured: to the server it is plaintext, captured to 15006.
			c, err := m.pods[m.clientNS].Dial(context.Background(), "tcp", b+":15001")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write([]byte("loop"))
			_, _ = c.Read(make([]byte, 1))
		}},
		{"an HBONE CONNECT to a pod's 15001", func(t *testing.T) {
			s, err := m.connect(t, b+":15001")
			var status *hbone.StatusError
			if !errors.As(err, &status) || status.Code != 400 {
				if s != nil {
					s.Close()
				}
				t.Errorf("CONNECT %s:15001 = %v, want status 400", b, err)
			}
		}},
		{"an HBONE CONNECT to a pod's 15008", func(t *testing.T) {
			if s, err := m.connect(t, b+":15008"); err == nil {
				s.Close()
				t.Errorf("CONNECT %s:15008 was accepted", b)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, goroutines := testutil.ToFloat64(refused), runtime.NumGoroutine()
			tc.attempt(t)
			// A loop doubles its goroutines every few milliseconds; give
			// one the time to show.
			time.Sleep(300 * time.Millisecond)
			if grew := runtime.NumGoroutine() - goroutines; grew > 50 {
				t.Fatalf("%d more goroutines after one connection: the proxy is looping", grew)
			}
			if got := testutil.ToFloat64(refused) - before; got < 1 {
				t.Errorf("canopy_node_connections_refused_total{reason=%q} grew by %v, want at least 1", reasonSelfCall, got)
			}
		})
	}
	// Nothing above broke the mesh.
	if got, err := m.call(t); got != "hello through the mesh" {
		t.Errorf("call after the attempts = %q, %v", got, err)
	}
}

// connect opens an HBONE stream from the client pod (its identity, its
// proxy's mark) to the server pod with the given authority.
func (m *mesh) connect(t *testing.T, authority string) (*hbone.Stream, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cert, err := m.proxy.Certs.Get(ctx, workloadapi.WorkloadIdentity(m.clientW))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.pods[m.clientNS].Dial(ctx, "tcp", net.JoinHostPort(m.pair.AddrB.String(), "15008"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := hbone.ClientTLS(ctx, raw, clientTLS(cert.TLS(), m.proxy.Certs.Roots(), []workloadapi.Identity{workloadapi.WorkloadIdentity(m.serverW)}))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc.Connect(ctx, authority, nil)
}
