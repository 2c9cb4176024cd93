package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// ambientClients are the numbers of node proxies the ambient scenario
// connects, fewest first: the figures per client are taken from each
// controller's first connection of that many (RSS does not shrink after
// clients leave).
var ambientClients = []int{1, 50}

// ambientReadinessClients is how many node proxies the readiness
// sub-benchmark connects.
const ambientReadinessClients = 50

// ambientMesh is benchMesh (1,000 Services, 10,000 pods behind them, 100
// client pods) with every namespace enrolled in ambient mode, so that
// both controllers treat its pods as ambient workloads.
func ambientMesh() mesh {
	m := benchMesh()
	m.NamespaceLabels = map[string]string{"istio.io/dataplane-mode": "ambient"}
	return m
}

// BenchmarkAmbient compares canopy-controller with istiod serving node
// proxies that subscribe as ztunnel does (deltaClient: Address and
// Authorization as wildcards over Delta ADS) in the mesh of
// BenchmarkProxyless with its namespaces enrolled in ambient mode
// (ambientMesh). Each node proxy holds the whole Address table, a
// workload per pod and an entry per Service, about 11,000. The
// sub-benchmarks, with each controller's clients connected in turn, the
// other idling, report the figure for canopy and istiod and their ratio:
//
//   - clients=1, clients=50: resident memory at rest and per connected
//     node proxy ((RSS once every client holds the table and the
//     controller is at rest − RSS at rest)/clients), and the time from
//     dialling until every client holds the whole Address table (its
//     last response that added a name); the table's size as each
//     controller sends it is reported too (canopy-addresses,
//     istiod-addresses), since the two tables need not be the same;
//   - readiness: one pod of svc-1 turning not ready (or ready again,
//     endpointRounds changes) until all ambientReadinessClients have an
//     Address update that says so (its workload UNHEALTHY or gone,
//     HEALTHY again).
func BenchmarkAmbient(b *testing.B) {
	m := ambientMesh()
	if m.Clients < max(ambientReadinessClients, ambientClients[len(ambientClients)-1]) {
		b.Fatalf("%d client pods are too few", m.Clients)
	}
	cp := startControlPlanes(b, m)

	for _, n := range ambientClients {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { ambientConnect(b, cp, n) })
	}
	b.Run("readiness", func(b *testing.B) { ambientReadiness(b, cp) })
}

// ambientConnect measures memory and the time to a full table with n
// node proxies.
func ambientConnect(b *testing.B, cp *controlPlanes, n int) {
	type figures struct {
		rest, perClient float64
		took            time.Duration
		addresses       int
	}
	first := map[string]figures{}
	round := 0
	for b.Loop() {
		for _, s := range cp.sides(round) {
			cp.waitIdle(b)
			rest, err := readMemory(s.pid)
			if err != nil {
				b.Fatal(err)
			}
			clients, took, held := cp.connectDelta(b, s, n, watchedPod{})
			with, err := readMemory(s.pid)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: %d node proxies hold %d addresses and %d authorizations after %s; RSS %.1f MB at rest, %.1f MB with them (peak so far %.1f MB); sent %s",
				s.name, n, held[addressType], held[authorizationType], took.Round(time.Millisecond), mb(rest.RSS), mb(with.RSS), mb(with.Peak), since(nil, clients, workloadTypes[:]))
			heapProfile(b, s, fmt.Sprintf("ambient-%d-clients-round-%d", n, round))
			closeAll(clients)
			cp.waitClosed(b, s)
			if _, ok := first[s.name]; !ok {
				first[s.name] = figures{rest: mb(rest.RSS), perClient: float64(with.RSS-rest.RSS) / 1024 / float64(n), took: took, addresses: held[addressType]}
			}
		}
		round++
	}
	c, i := first[cp.canopy.name], first[cp.istiod.name]
	reportTimes(b, c.took, i.took)
	b.ReportMetric(c.rest, "canopy-rest-MB")
	b.ReportMetric(i.rest, "istiod-rest-MB")
	b.ReportMetric(c.rest/i.rest, "rest-canopy/istiod")
	b.ReportMetric(c.perClient, "canopy-KB/client")
	b.ReportMetric(i.perClient, "istiod-KB/client")
	if i.perClient > 0 {
		b.ReportMetric(c.perClient/i.perClient, "client-canopy/istiod")
	}
	b.ReportMetric(float64(c.addresses), "canopy-addresses")
	b.ReportMetric(float64(i.addresses), "istiod-addresses")
}

// ambientReadiness measures a pod's readiness change until every node
// proxy has it.
func ambientReadiness(b *testing.B, cp *controlPlanes) {
	const svc = endpointService
	ns, name := cp.mesh.namespace(svc), cp.mesh.pod(svc, 0)
	watch := watchedPod{namespace: ns, name: name}
	took := map[string][]time.Duration{}
	ready := true
	round := 0
	for b.Loop() {
		for _, s := range cp.sides(round) {
			clients, _, _ := cp.connectDelta(b, s, ambientReadinessClients, watch)
			for _, c := range clients {
				if r := c.heldReady(); r == nil || *r != ready {
					b.Fatalf("%s: workload %s/%s not held as ready=%t (%v)", c.name, ns, name, ready, r)
				}
			}
			for range endpointRounds {
				ready = !ready
				ctx, cancel := context.WithTimeout(b.Context(), waitTimeout)
				ats := make([]<-chan time.Time, len(clients))
				for k, c := range clients {
					var err error
					if ats[k], err = c.expectReady(ready); err != nil {
						b.Fatalf("%s: %v", s.name, err)
					}
				}
				start := time.Now()
				if err := setReady(ctx, cp.env.Client, ns, name, ready); err != nil {
					b.Fatal(err)
				}
				var last time.Time
				for k, c := range clients {
					at, err := c.await(ctx, ats[k])
					if err != nil {
						b.Fatalf("%s: %v (%v)", s.name, err, s.alive())
					}
					last = latest(last, at)
				}
				cancel()
				d := last.Sub(start)
				took[s.name] = append(took[s.name], d)
				cp.waitIdle(b)
				b.Logf("%s: pod %s/%s ready=%t reached %d node proxies in %s", s.name, ns, name, ready, len(clients), d.Round(time.Millisecond))
			}
			b.Logf("%s: sent %s", s.name, since(nil, clients, workloadTypes[:]))
			closeAll(clients)
			cp.waitClosed(b, s)
		}
		round++
	}
	reportTimes(b, median(took[cp.canopy.name]), median(took[cp.istiod.name]))
}

// ztunnelNode is the node that ztunnel sends when it runs as pod
// client-<k> of the mesh (its namespace is the one the token of the
// client's service account is for, which Canopy requires).
func ztunnelNode(m mesh, k int) (*corev3.Node, error) {
	ns, pod, ip := m.clientNamespace(k), m.client(k), m.clientIP(k)
	md, err := structpb.NewStruct(map[string]any{
		"NAME": pod, "NAMESPACE": ns, "INSTANCE_IPS": ip, "NODE_NAME": m.node(k), "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": istioVersion,
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns), Metadata: md}, nil
}

// connectDelta connects n node proxies to s at once, each over a
// connection of its own, waits until every one has ACKed a response of
// each type and s is at rest again, and checks that all hold the same
// number of addresses. It returns the clients, the time from the first
// dial until the last client's table last grew, and how many names of
// each type every client holds.
func (cp *controlPlanes) connectDelta(b *testing.B, s *side, n int, watch watchedPod) ([]*deltaClient, time.Duration, map[string]int) {
	b.Helper()
	ctx := b.Context()
	start := time.Now()
	clients := dialAll(b, s, n, func(k int) (*deltaClient, error) {
		node, err := ztunnelNode(cp.mesh, k)
		if err != nil {
			return nil, err
		}
		conn, md, err := s.dial(cp.mesh.clientNamespace(k), clientAccount)
		if err != nil {
			return nil, err
		}
		return dialDelta(ctx, s.name+"/"+cp.mesh.client(k), conn, md, node, watch)
	})
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	for _, c := range clients {
		if err := c.waitAnswered(wctx); err != nil {
			b.Fatalf("%s: %v (%v)", s.name, err, s.alive())
		}
	}
	// The table may come in more than one response: it is whole once
	// the controller has nothing more to send.
	if _, err := waitIdle(ctx, idleTimeout, s.pid); err != nil {
		b.Fatal(err)
	}
	var last time.Time
	var want map[string]int
	for _, c := range clients {
		held, answers, grew := c.state()
		if want == nil {
			want = held
			// Which addresses are not the mesh's pods and Services says
			// why the controllers' counts differ, if they do.
			others := c.heldNames(addressType, func(name string) bool {
				return !strings.Contains(name, "/svc-") && !strings.Contains(name, "/client-")
			})
			b.Logf("%s: %s holds %v after %v responses; addresses other than the mesh's pods and Services: %q", s.name, c.name, shortTypes(held), shortTypes(answers), others)
		} else if held[addressType] != want[addressType] {
			b.Fatalf("%s: %s holds %d addresses, %s %d", s.name, c.name, held[addressType], clients[0].name, want[addressType])
		}
		last = latest(last, grew)
	}
	return clients, last.Sub(start), want
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// shortTypes keys a count by type by the types' short names.
func shortTypes(m map[string]int) map[string]int {
	out := map[string]int{}
	for typ, v := range m {
		out[shortType(typ)] = v
	}
	return out
}
