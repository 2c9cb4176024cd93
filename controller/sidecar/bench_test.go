package sidecar_test

import (
	"fmt"
	"testing"

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
