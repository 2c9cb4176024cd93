package controlplane_test

import (
	"fmt"
	"testing"
)

// The proxyless scenario: each client calls listenersPerClient
// Services, the sharedServices every client calls, svc-0 (with a
// VirtualService, routeService) and svc-1 (without, endpointService), and
// as many of its own.
const (
	listenersPerClient = 10
	sharedServices     = 2
)

// proxylessServices are the Services client k calls: the shared ones,
// then listenersPerClient-sharedServices of its own.
func proxylessServices(k int) []int {
	out := make([]int, 0, listenersPerClient)
	for i := range sharedServices {
		out = append(out, i)
	}
	own := listenersPerClient - sharedServices
	for j := range own {
		out = append(out, sharedServices+own*k+j)
	}
	return out
}

// BenchmarkProxyless compares canopy-controller with istiod serving 100
// proxyless gRPC clients of a mesh of 1,000 Services and 10,000
// endpoints (benchMesh), each calling 10 of them; compare says what the
// sub-benchmarks measure.
func BenchmarkProxyless(b *testing.B) {
	m := benchMesh()
	if m.Services < sharedServices+(listenersPerClient-sharedServices)*m.Clients {
		b.Fatalf("%d Services are too few for %d clients", m.Services, m.Clients)
	}
	cp := startControlPlanes(b, m)

	compare(b, cp, proxylessScenario(m))
}

// proxylessScenario: client k is pod client-<k> of the mesh, a proxyless
// gRPC client of the Services proxylessServices(k).
func proxylessScenario(m mesh) scenario {
	return scenario{
		clients: m.Clients,
		proxy: func(k int) (proxy, error) {
			ns, pod := m.clientNamespace(k), m.client(k)
			node, err := grpcNode(ns, pod, clientAccount, m.clientIP(k), map[string]string{"app": "client"})
			if err != nil {
				return proxy{}, err
			}
			var listeners []string
			for _, i := range proxylessServices(k) {
				listeners = append(listeners, fmt.Sprintf("%s:%d", m.host(i), servicePort))
			}
			return proxy{pod: pod, namespace: ns, account: clientAccount, node: node, sub: proxylessSubscription(listeners)}, nil
		},
		check: func(k int, c *sotwClient) error { return checkProxyless(m, k, c) },
	}
}

// checkProxyless checks that client k was sent every endpoint of every
// Service it calls, ready.
func checkProxyless(m mesh, k int, c *sotwClient) error {
	eps := healthyEndpoints(c.snapshot(endpointType))
	for _, i := range proxylessServices(k) {
		if got := len(eps[m.host(i)]); got != m.EndpointsPerService {
			return fmt.Errorf("%s: %d ready endpoints of %s, want %d (clusters %v)", c.name, got, m.host(i), m.EndpointsPerService, c.names[clusterType])
		}
	}
	return nil
}
