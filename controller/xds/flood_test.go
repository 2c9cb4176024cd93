package xds_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/internal/xdsclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// countingReviewer counts the TokenReviews that reach the API server.
type countingReviewer struct {
	inner authn.TokenReviewer
	n     atomic.Int64
}

func (c *countingReviewer) Review(ctx context.Context, token string, audiences []string) (authenticationv1.TokenReviewStatus, error) {
	c.n.Add(1)
	return c.inner.Review(ctx, token, audiences)
}

// firstResponse records when a proxy's first response arrived.
type firstResponse struct {
	table *workloadtable.Table
	once  sync.Once
	at    chan time.Time
}

func newFirstResponse() *firstResponse {
	return &firstResponse{table: workloadtable.New(), at: make(chan time.Time, 1)}
}

func (f *firstResponse) Apply(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
	f.once.Do(func() { f.at <- time.Now() })
	return f.table.Apply(typeURL, rs, removed)
}

// timeToFirstResponse runs a node proxy with token and reports how long it
// took to get its first response, or fails the test after bound.
func (m *mesh) timeToFirstResponse(t *testing.T, pod, token string, bound time.Duration) time.Duration {
	t.Helper()
	rec := newFirstResponse()
	c, err := xdsclient.New(xdsclient.Config{
		Conn: dial(t, m.addr), Node: m.node(t, pod, ""), ClusterID: "Kubernetes",
		Token: func(context.Context) (string, error) { return token, nil }, Handler: rec, InitialBackoff: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := &proxy{client: c, table: rec.table}
	p.run(t)
	select {
	case at := <-rec.at:
		return at.Sub(start)
	case <-time.After(bound):
		t.Fatalf("%s: no first response within %s", pod, bound)
		return 0
	}
}

// flood opens streams with bogus tokens (a new one each time, so no cache
// can answer them) from workers goroutines, each sending a first request as
// a proxy would, until stop is closed (or once each when once is set).
func (m *mesh) flood(t *testing.T, workers int, once bool, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	conns := make([]*grpc.ClientConn, 8)
	for i := range conns {
		conns[i] = dial(t, m.addr)
	}
	node := m.node(t, "ztunnel-bogus", "")
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range workers {
		wg.Go(func() {
			client := discoveryv3.NewAggregatedDiscoveryServiceClient(conns[i%len(conns)])
			<-start
			for {
				b := make([]byte, 24)
				_, _ = rand.Read(b)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer garbage-"+hex.EncodeToString(b))
				if st, err := client.DeltaAggregatedResources(ctx); err == nil {
					if st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: workloadapi.AddressTypeURL}) == nil {
						_, _ = st.Recv()
					}
				}
				cancel()
				if once {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	close(start)
	return &wg
}

// TestBogusTokenFlood: a flood of streams with bogus tokens neither
// floods the API server with TokenReviews nor keeps real proxies out.
// A proxy whose token was reviewed before gets in at once; one with a
// new token gets in within a few seconds of a burst of bogus streams.
func TestBogusTokenFlood(t *testing.T) {
	testenv.Need(t, env)
	// The reviewer's client as the controller configures its own.
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = 50, 100
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	reviews := &countingReviewer{inner: authn.Reviewer{Client: client.AuthenticationV1()}}
	auth, err := authn.New(authn.Config{LocalCluster: "Kubernetes", Clusters: map[string]authn.TokenReviewer{"Kubernetes": reviews}})
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{n: 10}
	m := newMeshWithAuth(t, xds.Config{}, src, auth)
	synced := make(chan struct{})
	close(synced)
	m.run(t, synced)
	const bound = 5 * time.Second

	// A proxy connects before the flood: its token is now known good.
	known := m.token(t)
	m.timeToFirstResponse(t, "ztunnel-before", known, bound)

	// 1. A sustained flood from 200 concurrent streams; a second proxy
	// with the known token connects in the middle of it.
	const workers = 200
	stop := make(chan struct{})
	before := reviews.n.Load()
	floodStart := time.Now()
	wg := m.flood(t, workers, false, stop)
	time.Sleep(time.Second)
	cached := m.timeToFirstResponse(t, "ztunnel-known-token", known, bound)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	elapsed := time.Since(floodStart)
	sustained := reviews.n.Load() - before
	t.Logf("sustained flood of %d streams for %s: %d TokenReviews; known-token proxy's first response after %s",
		workers, elapsed.Round(time.Millisecond), sustained, cached.Round(time.Millisecond))
	// The default review budget, and some slack.
	budget := func(d time.Duration) int64 {
		return int64(authn.DefaultReviewBurst + authn.DefaultReviewQPS*d.Seconds() + 10)
	}
	if limit := budget(elapsed); sustained > limit {
		t.Errorf("%d TokenReviews during the flood, want at most %d", sustained, limit)
	}

	// 2. A burst of 200 bogus streams at once, and a proxy with a token
	// never reviewed before.
	newToken := m.token(t)
	before = reviews.n.Load()
	burstStart := time.Now()
	wg = m.flood(t, workers, true, nil)
	fresh := m.timeToFirstResponse(t, "ztunnel-new-token", newToken, bound)
	wg.Wait()
	elapsed = time.Since(burstStart)
	burst := reviews.n.Load() - before
	t.Logf("burst of %d bogus streams: %d TokenReviews in %s; new-token proxy's first response after %s",
		workers, burst, elapsed.Round(time.Millisecond), fresh.Round(time.Millisecond))
	if limit := budget(elapsed); burst > limit {
		t.Errorf("%d TokenReviews for a burst of %d bogus streams, want at most %d", burst, workers, limit)
	}
}
