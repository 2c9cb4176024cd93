package sidecar_test

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/sidecar/sidecartest"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// BenchmarkNewMesh: what every change of the mesh costs once, before any
// client is served.
func BenchmarkNewMesh(b *testing.B) {
	in := sidecartest.Mesh(1000, 10)
	b.ReportAllocs()
	for b.Loop() {
		sidecar.NewMesh(in)
	}
}

// BenchmarkGRPCClientPush: one proxyless client's whole push (listeners,
// routes, clusters with both subsets, endpoints) for the 10 Services it
// calls, in a mesh of 1,000.
func BenchmarkGRPCClientPush(b *testing.B) {
	m := sidecar.NewMesh(sidecartest.Mesh(1000, 10))
	p := sidecar.Proxy{Namespace: "ns-0"}
	var listeners, routes, clusters []string
	for i := 0; i < 100; i += 10 {
		host := fmt.Sprintf("svc-%d.ns-0.svc.cluster.local", i)
		listeners = append(listeners, host+":8080")
		routes = append(routes, sidecar.ClusterName(sidecar.Outbound, 8080, "", host))
		for _, ss := range []string{"", "v0", "v1"} {
			clusters = append(clusters, sidecar.ClusterName(sidecar.Outbound, 8080, ss, host))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(m.GRPCListeners(p, listeners)) != 10 || len(m.GRPCRoutes(p, routes)) != 10 ||
			len(m.GRPCClusters(p, clusters)) != 30 || len(m.Endpoints(p, clusters)) != 30 {
			b.Fatal("missing resources")
		}
	}
}

// pushBench is 100 Envoy sidecars (ten in each of ten namespaces, each a
// pod of its own Service, as bench/controlplane's) of a mesh of 1,000
// Services, and what each asks for: clusters, listeners, every cluster's
// endpoints and the route configuration of the services' port.
type pushBench struct {
	proxies []sidecar.Proxy
	asked   map[string][]string
}

func newPushBench(in sidecar.Inputs) pushBench {
	var pb pushBench
	for k := range 100 {
		i, j := k*10+k%10, k%10
		pb.proxies = append(pb.proxies, sidecar.Proxy{
			Namespace: fmt.Sprintf("ns-%d", i%10),
			Labels:    map[string]string{"app": fmt.Sprintf("svc-%d", i), "version": fmt.Sprintf("v%d", j%2)},
			IPs:       []netip.Addr{netip.AddrFrom4([4]byte{10, byte(100 + j), byte(i >> 8), byte(i)})},
		})
	}
	var edsNames []string
	for _, n := range sidecar.NewMesh(in).GenerateSidecar(pb.proxies[0], sidecar.ClusterType, nil) {
		if n.Resource.(*clusterv3.Cluster).GetType() == clusterv3.Cluster_EDS {
			edsNames = append(edsNames, n.Name)
		}
	}
	pb.asked = map[string][]string{sidecar.ClusterType: nil, sidecar.ListenerType: nil, sidecar.EndpointType: edsNames, sidecar.RouteType: {"8080"}}
	return pb
}

// heldShare is what a push holds of a share: what its generation read,
// and the Mesh's dependencies for that then.
type heldShare struct {
	reads *sidecar.Reads
	deps  string
}

// push builds a Mesh of in and generates and marshals every share the
// sidecars ask for once per distinct key, as the controller's cache
// does, except shares of prev's keys whose dependencies are unchanged
// (nil: none), which it takes over; it returns how many resources it
// generated and what it holds. perProxy keys every share by its proxy
// too: nothing is shared.
func (pb pushBench) push(b *testing.B, in sidecar.Inputs, prev map[string]heldShare, perProxy bool) (int, map[string]heldShare) {
	m := sidecar.NewMesh(in)
	held := map[string]heldShare{}
	generated := 0
	for k, p := range pb.proxies {
		for typ, names := range pb.asked {
			for _, sh := range m.SidecarShares(p, typ, names) {
				key := typ + "\x00" + sh.Key + "\x00" + sh.Name
				if perProxy {
					key = strconv.Itoa(k) + "\x00" + key
				}
				if _, done := held[key]; done {
					continue
				}
				if h, ok := prev[key]; ok && m.DepsOf(h.reads) == h.deps {
					held[key] = h
					continue
				}
				r := &sidecar.Reads{}
				named := sh.Generate(r)
				held[key] = heldShare{r, m.DepsOf(r)}
				for _, n := range named {
					if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(n.Resource); err != nil {
						b.Fatal(err)
					}
					generated++
				}
			}
		}
	}
	return generated, held
}

// BenchmarkSidecarPush: a full push to pushBench's 100 sidecars, with
// shares ("shared") and with a share per sidecar ("per-proxy": what a
// push cost when each sidecar's addresses made it a class of its own).
func BenchmarkSidecarPush(b *testing.B) {
	in := sidecartest.Mesh(1000, 10)
	pb := newPushBench(in)
	for _, perProxy := range []bool{false, true} {
		name := "shared"
		if perProxy {
			name = "per-proxy"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var generated int
			for b.Loop() {
				generated, _ = pb.push(b, in, nil, perProxy)
			}
			b.ReportMetric(float64(generated), "resources/op")
		})
	}
}

// BenchmarkSidecarEndpointChange: what one pod turning not ready costs
// pushBench's sidecars once the previous push is held: the Mesh rebuilt,
// every share's key and dependencies worked out, and only what changed (the
// service's assignments) generated.
func BenchmarkSidecarEndpointChange(b *testing.B) {
	in := sidecartest.Mesh(1000, 10)
	pb := newPushBench(in)
	_, held := pb.push(b, in, nil, false)
	changed := sidecartest.Mesh(1000, 10)
	for _, a := range changed.Addresses {
		if w := a.GetWorkload(); w.GetName() == "svc-1-0" {
			w.Status = workloadapi.WorkloadStatus_UNHEALTHY
		}
	}
	b.ReportAllocs()
	var generated int
	for b.Loop() {
		generated, _ = pb.push(b, changed, held, false)
	}
	b.ReportMetric(float64(generated), "resources/op")
}
