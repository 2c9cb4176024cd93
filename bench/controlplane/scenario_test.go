package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// What every scenario measures.
const (
	// endpointRounds (even, so that the pod ends Ready) and routeRounds
	// are the changes measured per controller and iteration.
	endpointRounds = 6
	routeRounds    = 5
	// waitTimeout bounds each wait for clients.
	waitTimeout = 2 * time.Minute
	// The Services whose changes are measured: svc-0, with a
	// VirtualService, and svc-1, without. Every client of every scenario
	// has both.
	routeService    = 0
	endpointService = 1
)

// benchMesh is the mesh of every scenario: 1,000 Services of 10
// endpoints, a VirtualService and DestinationRule for every tenth, 100
// client pods.
func benchMesh() mesh {
	return mesh{Namespaces: 10, Services: 1000, EndpointsPerService: 10, VirtualServiceEvery: 10, Nodes: 3, Clients: 100}
}

// scenario is a kind of client: how many connect, and how client k does.
type scenario struct {
	clients int
	// proxy is client k.
	proxy func(k int) (proxy, error)
	// check checks what client k was sent once synced.
	check func(k int, c *sotwClient) error
}

// proxy is one client: the pod it stands for, the namespace and service
// account it acts for, its node and how it subscribes.
type proxy struct {
	pod, namespace, account string
	node                    *corev3.Node
	sub                     subscription
}

// compare runs the sub-benchmarks every scenario has, with sc's clients
// connected to one controller at a time (the other idles), which one
// first alternating by iteration. Each reports the figure for canopy and
// istiod and their ratio (below 1: Canopy is faster or smaller):
//
//   - memory: resident memory at rest (the mesh loaded, no client) and
//     per connected client ((RSS with every client synced − RSS at
//     rest)/clients), from the first connection of each (RSS does not
//     shrink after clients leave, so later iterations would understate
//     it);
//   - push: from the clients dialling until every one has ACKed
//     listeners, routes, clusters and endpoints;
//   - endpoint: one pod of svc-1 turning not ready (or ready again)
//     until every client has received endpoints that say so;
//     kube-slice-ms is how long kube-controller-manager took to write it
//     into the EndpointSlice, which istiod reads and Canopy does not
//     (Canopy reads the pod);
//   - virtualservice: svc-0's VirtualService changing its weights until
//     every client has received the route configuration with them.
//
// Times are medians over the rounds of every iteration.
func compare(b *testing.B, cp *controlPlanes, sc scenario) {
	b.Run("memory", func(b *testing.B) {
		ctx := b.Context()
		type figures struct{ rest, perClient float64 }
		first := map[string]figures{}
		round := 0
		for b.Loop() {
			for _, s := range cp.sides(round) {
				cp.waitIdle(b)
				rest, err := readMemory(s.pid)
				if err != nil {
					b.Fatal(err)
				}
				clients, _ := cp.connect(b, s, sc)
				if _, err := waitIdle(ctx, idleTimeout, s.pid); err != nil {
					b.Fatal(err)
				}
				with, err := readMemory(s.pid)
				if err != nil {
					b.Fatal(err)
				}
				cp.disconnect(b, s, clients)
				b.Logf("%s: RSS %.1f MB at rest, %.1f MB with %d clients (peak so far %.1f MB)", s.name, mb(rest.RSS), mb(with.RSS), len(clients), mb(with.Peak))
				if _, ok := first[s.name]; !ok {
					first[s.name] = figures{rest: mb(rest.RSS), perClient: float64(with.RSS-rest.RSS) / 1024 / float64(len(clients))}
				}
			}
			round++
		}
		c, i := first[cp.canopy.name], first[cp.istiod.name]
		noTime(b)
		b.ReportMetric(c.rest, "canopy-rest-MB")
		b.ReportMetric(i.rest, "istiod-rest-MB")
		b.ReportMetric(c.rest/i.rest, "rest-canopy/istiod")
		b.ReportMetric(c.perClient, "canopy-KB/client")
		b.ReportMetric(i.perClient, "istiod-KB/client")
		if i.perClient > 0 {
			b.ReportMetric(c.perClient/i.perClient, "client-canopy/istiod")
		}
	})

	b.Run("push", func(b *testing.B) {
		took := map[string][]time.Duration{}
		round := 0
		for b.Loop() {
			for _, s := range cp.sides(round) {
				cp.waitIdle(b)
				clients, d := cp.connect(b, s, sc)
				took[s.name] = append(took[s.name], d)
				b.Logf("%s: %d clients synced in %s; sent %s", s.name, len(clients), d.Round(time.Millisecond), since(nil, clients, chain[:]))
				cp.disconnect(b, s, clients)
			}
			round++
		}
		reportTimes(b, median(took[cp.canopy.name]), median(took[cp.istiod.name]))
	})

	b.Run("endpoint", func(b *testing.B) {
		ctx := b.Context()
		const svc = endpointService
		ns, name, ip := cp.mesh.namespace(svc), cp.mesh.pod(svc, 0), cp.mesh.podIP(svc, 0)
		took := map[string][]timed{}
		var slice []time.Duration
		ready := true
		round := 0
		for b.Loop() {
			for _, s := range cp.sides(round) {
				clients, _ := cp.connect(b, s, sc)
				cp.waitIdle(b)
				waitProfile := startProfile(b, s, "endpoint")
				for range endpointRounds {
					before := totals(clients)
					ready = !ready
					sliced, stop, err := watchSliceReady(ctx, cp.env.Client, ns, cp.mesh.service(svc), ip, ready)
					if err != nil {
						b.Fatal(err)
					}
					d := cp.measure(b, s, clients, endpointType, func(tbl table) bool {
						return slices.Contains(healthyEndpoints(tbl)[cp.mesh.host(svc)], ip) == ready
					}, func(ctx context.Context) error {
						return setReady(ctx, cp.env.Client, ns, name, ready)
					})
					sd, err := awaitTime(ctx, sliced)
					stop()
					if err != nil {
						b.Fatalf("EndpointSlice of %s/%s: %v", ns, cp.mesh.service(svc), err)
					}
					took[s.name] = append(took[s.name], d)
					slice = append(slice, sd.Sub(d.start))
					cp.waitIdle(b)
					b.Logf("%s: pod %s ready=%t reached %d clients in %s (EndpointSlice after %s); sent %s", s.name, name, ready, len(clients),
						d.took.Round(time.Millisecond), sd.Sub(d.start).Round(time.Millisecond), since(before, clients, chain[:]))
				}
				waitProfile()
				cp.disconnect(b, s, clients)
			}
			round++
		}
		reportTimes(b, median(durations(took[cp.canopy.name])), median(durations(took[cp.istiod.name])))
		b.ReportMetric(ms(median(slice)), "kube-slice-ms")
	})

	b.Run("virtualservice", func(b *testing.B) {
		const svc = routeService
		ns, name := cp.mesh.namespace(svc), cp.mesh.service(svc)
		took := map[string][]timed{}
		change := 0
		round := 0
		for b.Loop() {
			for _, s := range cp.sides(round) {
				clients, _ := cp.connect(b, s, sc)
				cp.waitIdle(b)
				for range routeRounds {
					before := totals(clients)
					change++
					weight := int32(10 + (7*change)%80) // never the initial 90, never the previous
					d := cp.measure(b, s, clients, routeType, func(tbl table) bool {
						return v0Share(tbl, cp.mesh.host(svc)) == weight
					}, func(ctx context.Context) error {
						vs, err := cp.istio.NetworkingV1().VirtualServices(ns).Get(ctx, name, metav1.GetOptions{})
						if err != nil {
							return err
						}
						vs.Spec.Http[0].Route = split(name, weight)
						_, err = cp.istio.NetworkingV1().VirtualServices(ns).Update(ctx, vs, metav1.UpdateOptions{})
						return err
					})
					took[s.name] = append(took[s.name], d)
					cp.waitIdle(b)
					b.Logf("%s: VirtualService %s/%s weight %d reached %d clients in %s; sent %s", s.name, ns, name, weight, len(clients),
						d.took.Round(time.Millisecond), since(before, clients, chain[:]))
				}
				cp.disconnect(b, s, clients)
			}
			round++
		}
		reportTimes(b, median(durations(took[cp.canopy.name])), median(durations(took[cp.istiod.name])))
	})
}

// waitIdle waits until both controllers are at rest.
func (cp *controlPlanes) waitIdle(b *testing.B) {
	b.Helper()
	if _, err := waitIdle(b.Context(), idleTimeout, cp.canopy.pid, cp.istiod.pid); err != nil {
		b.Fatal(err)
	}
}

// connect connects every client of sc to s at once, each over a
// connection of its own as separate processes would, waits until all are
// synced and checks what they were sent. It returns the clients and the
// time from the first dial until the last client synced.
func (cp *controlPlanes) connect(b *testing.B, s *side, sc scenario) ([]*sotwClient, time.Duration) {
	b.Helper()
	ctx := b.Context()
	start := time.Now()
	clients := dialAll(b, s, sc.clients, func(k int) (*sotwClient, error) {
		p, err := sc.proxy(k)
		if err != nil {
			return nil, err
		}
		conn, md, err := s.dial(p.namespace, p.account)
		if err != nil {
			return nil, err
		}
		return dialSotW(ctx, s.name+"/"+p.pod, conn, md, p.node, p.sub)
	})
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	var last time.Time
	for _, c := range clients {
		at, err := c.waitSynced(wctx)
		if err != nil {
			b.Fatalf("%s: %v (%v)", s.name, err, s.alive())
		}
		if at.After(last) {
			last = at
		}
	}
	took := last.Sub(start)
	for k, c := range clients {
		if err := sc.check(k, c); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
	}
	return clients, took
}

// disconnect closes clients and waits until s has seen every stream end.
func (cp *controlPlanes) disconnect(b *testing.B, s *side, clients []*sotwClient) {
	b.Helper()
	closeAll(clients)
	cp.waitClosed(b, s)
}

// waitClosed waits until s has no stream open.
func (cp *controlPlanes) waitClosed(b *testing.B, s *side) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), waitTimeout)
	defer cancel()
	for {
		n, err := s.connected(ctx)
		if err == nil && n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("%s: still %d streams open after the clients left (%v)", s.name, n, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dialAll dials n clients of s at once, each with dial in a goroutine
// of its own as separate processes would, closes them when the benchmark
// ends, and fails it if one could not connect.
func dialAll[T any, C interface {
	*T
	close()
}](b *testing.B, s *side, n int, dial func(k int) (C, error)) []C {
	b.Helper()
	clients := make([]C, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range clients {
		wg.Go(func() { clients[k], errs[k] = dial(k) })
	}
	wg.Wait()
	b.Cleanup(func() { closeAll(clients) })
	for _, err := range errs {
		if err != nil {
			b.Fatalf("%s: connect: %v", s.name, err)
		}
	}
	return clients
}

// closeAll closes the clients that were opened.
func closeAll[T any, C interface {
	*T
	close()
}](clients []C) {
	for _, c := range clients {
		if c != nil {
			c.close()
		}
	}
}

// totals sums what clients have received so far, by type.
func totals[C receiver](clients []C) map[string]traffic {
	sum := map[string]traffic{}
	for _, c := range clients {
		for typ, t := range c.traffic() {
			s := sum[typ]
			s.Responses += t.Responses
			s.Resources += t.Resources
			s.Bytes += t.Bytes
			sum[typ] = s
		}
	}
	return sum
}

// receiver is a client that counts what it received (clientStream).
type receiver interface{ traffic() map[string]traffic }

// since describes what clients received of types after totals returned
// before (nil: since they connected).
func since[C receiver](before map[string]traffic, clients []C, types []string) string {
	now := totals(clients)
	var out []string
	for _, typ := range types {
		t, b := now[typ], before[typ]
		out = append(out, fmt.Sprintf("%s %d responses (%d resources, %.2f MB)", shortType(typ),
			t.Responses-b.Responses, t.Resources-b.Resources, mb(int64(t.Bytes-b.Bytes))))
	}
	return strings.Join(out, ", ")
}

// timed is one measured change: when it was written and how long until
// the last client had it.
type timed struct {
	start time.Time
	took  time.Duration
}

// measure registers cond on the table of typ of every client, applies the
// change and returns how long until every client received a response that
// made cond true.
func (cp *controlPlanes) measure(b *testing.B, s *side, clients []*sotwClient, typ string, cond func(table) bool, change func(context.Context) error) timed {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), waitTimeout)
	defer cancel()
	ats := make([]<-chan time.Time, len(clients))
	for k, c := range clients {
		var err error
		if ats[k], err = c.expect(typ, cond); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
	}
	start := time.Now()
	if err := change(ctx); err != nil {
		b.Fatalf("apply the change: %v", err)
	}
	var last time.Time
	for k, c := range clients {
		at, err := c.await(ctx, ats[k])
		if err != nil {
			b.Fatalf("%s: %v (%v)", s.name, err, s.alive())
		}
		if at.After(last) {
			last = at
		}
	}
	return timed{start: start, took: last.Sub(start)}
}

// watchSliceReady reports when an EndpointSlice of Service ns/svc first
// lists ip with readiness ready.
func watchSliceReady(ctx context.Context, kube kubernetes.Interface, ns, svc, ip string, ready bool) (<-chan time.Time, func(), error) {
	eps := kube.DiscoveryV1().EndpointSlices(ns)
	opts := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc}
	list, err := eps.List(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	opts.ResourceVersion = list.ResourceVersion
	w, err := eps.Watch(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	out := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			for _, ep := range s.Endpoints {
				if slices.Contains(ep.Addresses, ip) && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) == ready {
					out <- time.Now()
					return
				}
			}
		}
	}()
	return out, w.Stop, nil
}

// awaitTime waits for a time on ch, up to waitTimeout.
func awaitTime(ctx context.Context, ch <-chan time.Time) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-time.After(waitTimeout):
		return time.Time{}, fmt.Errorf("not seen within %s", waitTimeout)
	}
}

// v0Share is the weight, in percent, that the route configurations of a
// table give to subset v0 of host, or -1 when none splits host's traffic.
func v0Share(tbl table, host string) int32 {
	for _, m := range tbl {
		for _, vh := range m.(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				var v0, total uint32
				for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
					w := wc.GetWeight().GetValue()
					total += w
					if strings.HasSuffix(wc.GetName(), "|v0|"+host) {
						v0 += w
					}
				}
				if total > 0 && v0 > 0 {
					return int32(v0 * 100 / total)
				}
			}
		}
	}
	return -1
}

func durations(ts []timed) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.took
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func mb(n int64) float64         { return float64(n) / (1 << 20) }

// noTime drops ns/op: an iteration's wall time holds connecting, checking
// and waiting for the controllers to be at rest, not a figure.
func noTime(b *testing.B) { b.ReportMetric(0, "ns/op") }

// reportTimes reports one time for each controller and their ratio.
func reportTimes(b *testing.B, canopy, istiod time.Duration) {
	noTime(b)
	b.ReportMetric(ms(canopy), "canopy-ms")
	b.ReportMetric(ms(istiod), "istiod-ms")
	if istiod > 0 {
		b.ReportMetric(float64(canopy)/float64(istiod), "canopy/istiod")
	}
}
