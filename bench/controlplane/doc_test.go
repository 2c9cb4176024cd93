// Package controlplane_test benchmarks Canopy's control plane against
// Istio's side by side: canopy-controller (built from the tree) and istiod
// (pilot-discovery, pinned in tools/istio) run as processes against one
// real API server (internal/testing/testenv) holding the same mesh, and
// the same clients connect to each in turn. Run it with
//
//	go test ./bench/controlplane -run '^$' -bench . -benchtime 1x -timeout 30m
//
// (-bench Proxyless, -bench Sidecar or -bench Ambient for one scenario,
// each starting its own environment; about 6 minutes for the proxyless
// one and 2 for the ambient one on 2 cores; CANOPY_ISTIO_BIN_DIR and CANOPY_KUBE_BIN_DIR point at the
// pinned binaries, else hack/tools.sh builds them; CANOPY_BENCH_PROFILE_DIR
// writes a CPU profile of canopy-controller over its endpoint rounds,
// endpoint.pprof, for CANOPY_BENCH_PROFILE_SECONDS, default 20, to that
// directory: profile_test.go). Every figure is reported for canopy and istiod and as the
// ratio canopy/istiod; ns/op is dropped, since an iteration's wall time
// is mostly connecting and waiting for the controllers to be at rest.
//
// The pieces are shared by the scenarios: mesh (fixture_test.go) writes
// Namespaces, Nodes, Ready pods, Services, DestinationRules and
// VirtualServices with a bounded pool of writers and waits for
// kube-controller-manager's EndpointSlices; controlPlanes
// (controlplanes_test.go) starts the environment and both controllers
// with the same push tuning and gives each as a side (how to dial it, its
// process for memory and CPU from /proc, its connected-streams gauge);
// proc_test.go reads RSS and CPU time and waits for the controllers to be
// at rest; compare (scenario_test.go) runs the sub-benchmarks (memory,
// push, endpoint, virtualservice) for a scenario, a kind of client; the
// clients are raw state-of-the-world ADS streams (sotw_client_test.go)
// that subscribe as a subscription says. BenchmarkProxyless
// (proxyless_test.go) has them subscribe as grpc-go's xDS client does,
// BenchmarkSidecar (sidecar_test.go) as an Envoy sidecar does.
// BenchmarkAmbient (ambient_test.go) has its own sub-benchmarks and
// clients: Delta ADS streams (delta_client_test.go) that subscribe as
// ztunnel does, istio.workload.Address and istio.security.Authorization
// as wildcards, ACKing every response, in the same mesh with its
// namespaces labelled istio.io/dataplane-mode=ambient (NamespaceLabels).
// It reports memory at rest and per node proxy and the time to the whole
// Address table for 1 and 50 node proxies, with the table's size as each
// controller sends it (both sent 11,101 addresses: 10,100 pods, 1,000
// Services and default/kubernetes), and a pod's readiness change until
// 50 node proxies have it. Four runs on 2 cores, canopy/istiod: RSS at
// rest 0.53 to 0.57 (about 260 MB against 470 MB); per node proxy with
// 50, 1.10 to 1.35 (5.6 to 6.3 MB against 4.6 to 5.1 MB); until 50 hold
// the table, 1.17 to 1.52 (2.6 to 3.4 s against 2.0 to 2.6 s); a
// readiness change, 0.92 to 0.95 (about 130 ms against 135 ms);
// docs/testing.md has the figures.
//
// Differences of setup that the figures carry: clients reach Canopy over
// TLS with a service-account token (reviewed once per token, then cached)
// and istiod on its plaintext port (no TLS and no authentication, since
// its CA is off); a pod's readiness reaches istiod through the
// EndpointSlice kube-controller-manager writes and Canopy from the pod
// itself (the endpoint figure reports the slice's delay separately).
package controlplane_test
