package xds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// stream is an open Delta stream that has had its first response.
type stream struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *stream) close() { s.cancel(); <-s.done }

// openStream opens a stream with token on cc, asks for addresses and waits
// for the first response; it returns the stream's error if it ends first.
func (m *mesh) openStream(t *testing.T, cc *grpc.ClientConn, token, pod string) (*stream, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: m.node(t, pod, ""), TypeUrl: workloadapi.AddressTypeURL}); err != nil {
		// The server ended the stream before reading: its status.
		_, err = st.Recv()
		cancel()
		return nil, err
	}
	first := make(chan error, 1)
	s := &stream{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_, err := st.Recv()
		first <- err
		for err == nil {
			_, err = st.Recv()
		}
	}()
	select {
	case err := <-first:
		if err != nil {
			cancel()
			<-s.done
			return nil, err
		}
		t.Cleanup(s.close)
		return s, nil
	case <-time.After(20 * time.Second):
		cancel()
		return nil, fmt.Errorf("no first response within 20s")
	}
}

func wantRefused(t *testing.T, err error, msg string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), msg) {
		t.Fatalf("stream ended with %v, want ResourceExhausted containing %q", err, msg)
	}
}

// TestStreamsPerCallerCapped: one caller may hold a bounded number of
// streams (default 10); the next is refused with ResourceExhausted and
// counted, and a closed stream frees its place.
func TestStreamsPerCallerCapped(t *testing.T) {
	testenv.Need(t, env)
	m := newMesh(t, xds.Config{}, &fakeSource{n: 1})
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)
	cc, tok := dial(t, m.addr), m.token(t)
	var open []*stream
	for i := range 10 {
		s, err := m.openStream(t, cc, tok, fmt.Sprintf("ztunnel-%d", i))
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		open = append(open, s)
	}
	_, err := m.openStream(t, cc, tok, "ztunnel-10")
	wantRefused(t, err, "streams open for caller")
	if got := testutil.ToFloat64(mustCounter(t, m, "canopy_xds_rejected_streams_total")); got != 1 {
		t.Errorf("refused streams counted %v times, want 1", got)
	}
	// The server sees the close shortly after the client.
	open[0].close()
	eventually.Within(t, settle, "a closed stream frees its place", func() bool {
		_, err := m.openStream(t, cc, tok, "ztunnel-10")
		return err == nil
	})
}

// TestStreamLimits: the total cap and the new-stream budget refuse the
// stream beyond them with ResourceExhausted; streams refused for their
// token use none of the budget.
func TestStreamLimits(t *testing.T) {
	testenv.Need(t, env)
	for _, tt := range []struct {
		name string
		cfg  xds.Config
		msg  string
	}{
		{"total cap", xds.Config{MaxStreams: 2}, "the server's limit"},
		{"new-stream budget", xds.Config{StreamsPerSecond: 0.01, StreamBurst: 2, StreamWait: -1}, "rate limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := newMesh(t, tt.cfg, &fakeSource{n: 1})
			synced := make(chan struct{})
			close(synced)
			m.run(t, synced)
			cc, tok := dial(t, m.addr), m.token(t)
			for range 3 {
				_, err := m.openStream(t, cc, "bogus", "ztunnel-bogus")
				if status.Code(err) != codes.Unauthenticated {
					t.Fatalf("bogus token: %v, want Unauthenticated", err)
				}
			}
			for i := range 2 {
				if _, err := m.openStream(t, cc, tok, fmt.Sprintf("ztunnel-%d", i)); err != nil {
					t.Fatalf("stream %d: %v", i, err)
				}
			}
			_, err := m.openStream(t, cc, tok, "ztunnel-2")
			wantRefused(t, err, tt.msg)
		})
	}
}
