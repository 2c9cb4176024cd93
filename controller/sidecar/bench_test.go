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

// BenchmarkSidecarPush: a full push to 100 Envoy sidecars (ten in each
// of ten namespaces, each a pod of its own Service, as
// bench/controlplane's) of a mesh of 1,000 Services: every share of
// clusters, listeners, endpoints and routes generated and marshalled once
// per distinct key, as the controller's cache does. "per-proxy" keys
// every share by its proxy too, so nothing is shared: what a push cost
// when each sidecar's addresses made it a class of its own.
func BenchmarkSidecarPush(b *testing.B) {
	in := sidecartest.Mesh(1000, 10)
	var proxies []sidecar.Proxy
	for k := range 100 {
		i, j := k*10+k%10, k%10
		proxies = append(proxies, sidecar.Proxy{
			Namespace: fmt.Sprintf("ns-%d", i%10),
			Labels:    map[string]string{"app": fmt.Sprintf("svc-%d", i), "version": fmt.Sprintf("v%d", j%2)},
			IPs:       []netip.Addr{netip.AddrFrom4([4]byte{10, byte(100 + j), byte(i >> 8), byte(i)})},
		})
	}
	// Every cluster's endpoints are asked for, and the route
	// configuration of the services' port.
	var edsNames []string
	for _, n := range sidecar.NewMesh(in).GenerateSidecar(proxies[0], sidecar.ClusterType, nil) {
		if n.Resource.(*clusterv3.Cluster).GetType() == clusterv3.Cluster_EDS {
			edsNames = append(edsNames, n.Name)
		}
	}
	asked := map[string][]string{sidecar.ClusterType: nil, sidecar.ListenerType: nil, sidecar.EndpointType: edsNames, sidecar.RouteType: {"8080"}}
	for _, perProxy := range []bool{false, true} {
		name := "shared"
		if perProxy {
			name = "per-proxy"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var generated int
			for b.Loop() {
				m := sidecar.NewMesh(in)
				done := map[string]bool{}
				generated = 0
				for k, p := range proxies {
					for typ, names := range asked {
						for _, sh := range m.SidecarShares(p, typ, names) {
							key := typ + "\x00" + sh.Key
							if perProxy {
								key = strconv.Itoa(k) + "\x00" + key
							}
							if done[key] {
								continue
							}
							done[key] = true
							for _, n := range sh.Generate() {
								if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(n.Resource); err != nil {
									b.Fatal(err)
								}
								generated++
							}
						}
					}
				}
			}
			b.ReportMetric(float64(generated), "resources/op")
		})
	}
}
