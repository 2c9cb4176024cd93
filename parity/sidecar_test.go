package parity

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// sidecarPod is a pod of the fixtures whose Envoy sidecar the test plays,
// with the allow-list of its comparison under testdata.
type sidecarPod struct {
	namespace, name, account, ip string
	// workload and app are what Istio's agent reads of the pod (its
	// workload name, its application container).
	workload, app string
	labels        map[string]string
	// ports are the pod's container ports as the agent sends them.
	ports     string
	allowList string
}

// sidecarPods: rpc/greeter-v2-0 of testdata/proxyless.yaml, which serves
// Service greeter (7070 → 8080, 9901) and is labelled for Istio mutual
// TLS, and sees the whole mesh; shop/cart-0 of testdata/traffic.yaml,
// scoped by the Sidecar resource shop/cart (egress hosts, an inbound
// connection pool).
var sidecarPods = []sidecarPod{
	{
		namespace: "rpc", name: "greeter-v2-0", account: "greeter", ip: "10.244.3.21", workload: "greeter-v2", app: "greeter",
		labels:    map[string]string{"app": "greeter", "version": "v2", "security.istio.io/tlsMode": "istio"},
		ports:     `[{"name":"grpc","containerPort":8080,"protocol":"TCP"}]`,
		allowList: "sidecar-allowlist.yaml",
	},
	{
		namespace: "shop", name: "cart-0", account: "cart", ip: "10.244.4.10", workload: "cart", app: "cart",
		labels:    map[string]string{"app": "cart", "version": "v1", "security.istio.io/tlsMode": "istio"},
		ports:     `[{"name":"http","containerPort":8080,"protocol":"TCP"}]`,
		allowList: "sidecar-scoped-allowlist.yaml",
	},
}

// node is the node Istio's agent sends for the pod's Envoy sidecar (wire
// contract: sidecar §1.5).
func (sp sidecarPod) node() (*corev3.Node, error) {
	lbls := map[string]any{}
	for k, v := range sp.labels {
		lbls[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"ISTIO_VERSION": "1.32.0", "CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local",
		"NAME": sp.name, "NAMESPACE": sp.namespace, "SERVICE_ACCOUNT": sp.account, "INSTANCE_IPS": sp.ip, "LABELS": lbls,
		"INTERCEPTION_MODE": "REDIRECT", "WORKLOAD_NAME": sp.workload, "APP_CONTAINERS": sp.app, "NODE_NAME": "node-1",
		"POD_PORTS":         sp.ports,
		"ENVOY_STATUS_PORT": 15021.0, "ENVOY_PROMETHEUS_PORT": 15090.0,
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{
		Id:      fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", sp.ip, sp.name, sp.namespace, sp.namespace),
		Cluster: sp.app + "." + sp.namespace, Metadata: md,
	}, nil
}

// compareSidecars compares each of sidecarPods (compareSidecar).
func compareSidecars(t *testing.T, istiodAddr, canopyAddr string) {
	for _, sp := range sidecarPods {
		t.Run(sp.namespace+"/"+sp.name, func(t *testing.T) { compareSidecar(t, istiodAddr, canopyAddr, sp) })
	}
}

// compareSidecar subscribes to both control planes as the Envoy sidecar of
// a pod and compares all four types whole, but for what only telemetry
// reads (withoutTelemetry): Istio's own Envoy build has stats, peer
// metadata and access log extensions Canopy does not configure.
// Differences the pod's allow-list does not list fail.
func compareSidecar(t *testing.T, istiodAddr, canopyAddr string, sp sidecarPod) {
	allowPath := filepath.Join("testdata", sp.allowList)
	allowList, err := readAllowList(allowPath, "Listener", "RouteConfiguration", "Cluster", "ClusterLoadAssignment")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	node, err := sp.node()
	if err != nil {
		t.Fatal(err)
	}
	istiodConn, canopyConn, canopyMD := envoyConnections(t, istiodAddr, canopyAddr, sp.namespace, sp.account)
	fromIstiod, err := subscribeSidecar(ctx, "istiod", istiodConn, node, metadata.MD{})
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("CANOPY_PARITY_DUMP")
	if dir != "" {
		waitQuiet(t, "istiod's sidecar view", fromIstiod)
		dumpView(t, filepath.Join(dir, "istiod-sidecar-"+sp.name+".json"), fromIstiod)
	}
	fromCanopy, err := subscribeSidecar(ctx, "canopy", canopyConn, node, canopyMD)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, "both sidecar views", fromIstiod, fromCanopy)
	if dir != "" {
		dumpView(t, filepath.Join(dir, "canopy-sidecar-"+sp.name+".json"), fromCanopy)
	}
	compareViews(t, "sidecar "+sp.name+" ", envoyTypes, withoutTelemetry{fromIstiod}, withoutTelemetry{fromCanopy}, allowList, allowPath)
}

// dumpView writes a view's resources as JSON, for a person reading them
// (CANOPY_PARITY_DUMP=dir).
func dumpView(t *testing.T, path string, v view) {
	t.Helper()
	out := map[string]map[string]json.RawMessage{}
	for _, typ := range envoyTypes {
		out[shortType(typ)] = map[string]json.RawMessage{}
		for name, a := range v.table(typ) {
			m, err := decode(typ, a)
			if err != nil {
				t.Fatal(err)
			}
			b, err := protojson.MarshalOptions{Resolver: lenientTypes{}}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out[shortType(typ)][name] = b
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// withoutTelemetry is a view of a sidecar's resources without what only
// telemetry reads: stat prefixes, access logs, tracing and request IDs,
// and Istio's own telemetry filters (stats, peer metadata, ALPN, gRPC
// stats). Endpoints within a locality are in no particular order.
type withoutTelemetry struct{ view }

// Telemetry filters of Istio's Envoy build, by name.
var (
	telemetryHTTPFilters    = []string{"istio.metadata_exchange", "istio.stats", "istio.alpn", "envoy.filters.http.grpc_stats", "istio.peer_metadata"}
	telemetryNetworkFilters = []string{"istio.stats"}
)

func (w withoutTelemetry) table(typ string) map[string]*anypb.Any {
	full := w.view.table(typ)
	out := make(map[string]*anypb.Any, len(full))
	for name, a := range full {
		m, err := decode(typ, a)
		if err != nil {
			out[name] = a // compareTables reports it
			continue
		}
		p, err := anypb.New(stripTelemetry(m))
		if err != nil {
			panic(err)
		}
		out[name] = p
	}
	return out
}

// stripTelemetry removes what only telemetry reads from a resource.
func stripTelemetry(m proto.Message) proto.Message {
	switch r := m.(type) {
	case *clusterv3.Cluster:
		r.AltStatName = ""
	case *listenerv3.Listener:
		r.AccessLog = nil
		r.StatPrefix = ""
		for _, fc := range append(slices.Clone(r.GetFilterChains()), r.GetDefaultFilterChain()) {
			if fc != nil {
				fc.Filters = stripFilters(fc.GetFilters())
			}
		}
	}
	return m
}

func stripFilters(filters []*listenerv3.Filter) []*listenerv3.Filter {
	var out []*listenerv3.Filter
	for _, f := range filters {
		if slices.Contains(telemetryNetworkFilters, f.GetName()) {
			continue
		}
		var hcm hcmv3.HttpConnectionManager
		var tcp tcpproxyv3.TcpProxy
		switch {
		case f.GetTypedConfig().MessageIs(&hcm) && f.GetTypedConfig().UnmarshalTo(&hcm) == nil:
			hcm.StatPrefix, hcm.AccessLog, hcm.Tracing, hcm.RequestIdExtension = "", nil, nil, nil
			hcm.HttpFilters = slices.DeleteFunc(hcm.HttpFilters, func(h *hcmv3.HttpFilter) bool { return slices.Contains(telemetryHTTPFilters, h.GetName()) })
			f = &listenerv3.Filter{Name: f.GetName(), ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyOf(&hcm)}}
		case f.GetTypedConfig().MessageIs(&tcp) && f.GetTypedConfig().UnmarshalTo(&tcp) == nil:
			tcp.StatPrefix, tcp.AccessLog = "", nil
			f = &listenerv3.Filter{Name: f.GetName(), ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyOf(&tcp)}}
		}
		out = append(out, f)
	}
	return out
}

func mustAnyOf(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}
