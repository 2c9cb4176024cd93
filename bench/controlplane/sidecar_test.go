package controlplane_test

import (
	"fmt"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// istioVersion is the ISTIO_VERSION a sidecar's agent reports.
const istioVersion = "1.32.0"

// BenchmarkSidecar compares canopy-controller with istiod serving 100
// Envoy sidecars of the mesh of BenchmarkProxyless (benchMesh: 1,000
// Services, 10,000 endpoints); compare says what the sub-benchmarks
// measure. A sidecar sees every Service: over 1,200 clusters (one per
// Service, two more per DestinationRule) and as many endpoint
// assignments, and the route configurations of its listeners.
func BenchmarkSidecar(b *testing.B) {
	m := benchMesh()
	for k := range m.Clients {
		if i, j := sidecarPod(m, k); i >= m.Services || j >= m.EndpointsPerService || i == endpointService {
			b.Fatalf("sidecar %d would be pod %d of Service %d", k, j, i)
		}
	}
	cp := startControlPlanes(b, m)

	compare(b, cp, sidecarScenario(m))
}

// sidecarPod returns the pod client k is the sidecar of: pod j of
// Service i, with i = 10k + k mod 10 for 100 sidecars of 1,000 Services,
// so that the sidecars spread over the namespaces (Service i is in
// ns-<i mod 10>) and each has an inbound side of its own; never a pod of
// svc-1, whose readiness the endpoint sub-benchmark changes.
func sidecarPod(m mesh, k int) (i, j int) {
	stride := m.Services / m.Clients
	return k*stride + k%stride, k % m.EndpointsPerService
}

// sidecarScenario: client k is the Envoy sidecar of pod sidecarPod(k).
func sidecarScenario(m mesh) scenario {
	watched := []string{m.host(routeService), m.host(endpointService)}
	return scenario{
		clients: m.Clients,
		proxy: func(k int) (proxy, error) {
			i, j := sidecarPod(m, k)
			node, err := sidecarNode(m, i, j)
			if err != nil {
				return proxy{}, err
			}
			return proxy{pod: m.pod(i, j), namespace: m.namespace(i), account: podAccount, node: node, sub: sidecarSubscription(watched)}, nil
		},
		check: func(_ int, c *sotwClient) error { return checkSidecar(m, c) },
	}
}

// sidecarNode is the node Istio's agent sends for the Envoy sidecar of
// pod j of Service i (as parity's sidecar node, with the fixture's pod).
func sidecarNode(m mesh, i, j int) (*corev3.Node, error) {
	ns, pod, ip := m.namespace(i), m.pod(i, j), m.podIP(i, j)
	labels := map[string]any{}
	for k, v := range m.podLabels(i, j) {
		labels[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"ISTIO_VERSION": istioVersion, "CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local",
		"NAME": pod, "NAMESPACE": ns, "SERVICE_ACCOUNT": podAccount, "INSTANCE_IPS": ip, "LABELS": labels,
		"INTERCEPTION_MODE": "REDIRECT", "WORKLOAD_NAME": m.service(i), "APP_CONTAINERS": "app", "NODE_NAME": m.node(j),
		"POD_PORTS":         fmt.Sprintf(`[{"name":"grpc","containerPort":%d,"protocol":"TCP"}]`, targetPort),
		"ENVOY_STATUS_PORT": 15021.0, "ENVOY_PROMETHEUS_PORT": 15090.0,
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns), Cluster: m.service(i) + "." + ns, Metadata: md}, nil
}

// sidecarSubscription subscribes as an Envoy sidecar does over
// state-of-the-world ADS: clusters and listeners as wildcards, then the
// clusters' EDS service names and the route configurations the
// listeners' connection managers name. It keeps decoded only the
// endpoints of the hosts watched and, of the route configurations, the
// virtual hosts that route to them; a sidecar's route configuration for
// port 8080 holds a virtual host for each of the 1,000 Services.
func sidecarSubscription(watched []string) subscription {
	return subscription{
		first: []request{{typ: clusterType}, {typ: listenerType}},
		deps:  [][2]string{{clusterType, endpointType}, {listenerType, routeType}},
		keep: func(typ, name string) bool {
			switch typ {
			case endpointType:
				return slices.Contains(watched, clusterHost(name))
			case routeType:
				return true
			}
			return false
		},
		project: func(m proto.Message) proto.Message {
			if rc, ok := m.(*routev3.RouteConfiguration); ok {
				return routesTo(rc, watched)
			}
			return m
		},
		complete: true,
	}
}

// routesTo returns a route configuration with only the virtual hosts of
// rc that have a route to a cluster of one of hosts.
func routesTo(rc *routev3.RouteConfiguration, hosts []string) *routev3.RouteConfiguration {
	out := &routev3.RouteConfiguration{Name: rc.GetName()}
	to := func(cluster string) bool { return cluster != "" && slices.Contains(hosts, clusterHost(cluster)) }
	for _, vh := range rc.GetVirtualHosts() {
		if slices.ContainsFunc(vh.GetRoutes(), func(rt *routev3.Route) bool {
			return to(rt.GetRoute().GetCluster()) || slices.ContainsFunc(rt.GetRoute().GetWeightedClusters().GetClusters(), func(wc *routev3.WeightedCluster_ClusterWeight) bool {
				return to(wc.GetName())
			})
		}) {
			out.VirtualHosts = append(out.VirtualHosts, vh)
		}
	}
	return out
}

// checkSidecar checks that a sidecar was sent a cluster and endpoint
// assignment for every Service, every endpoint of the watched ones ready,
// and svc-0's route split between its subsets.
func checkSidecar(m mesh, c *sotwClient) error {
	if n := c.held(endpointType); n < m.Services {
		return fmt.Errorf("%s: %d endpoint assignments (of %d clusters), want at least one per Service (%d)", c.name, n, c.held(clusterType), m.Services)
	}
	eps := healthyEndpoints(c.snapshot(endpointType))
	for _, i := range []int{routeService, endpointService} {
		if got := len(eps[m.host(i)]); got != m.EndpointsPerService {
			return fmt.Errorf("%s: %d ready endpoints of %s, want %d", c.name, got, m.host(i), m.EndpointsPerService)
		}
	}
	if v0Share(c.snapshot(routeType), m.host(routeService)) < 0 {
		return fmt.Errorf("%s: no route splits %s between subsets (%d route configurations)", c.name, m.host(routeService), c.held(routeType))
	}
	return nil
}
