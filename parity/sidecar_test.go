package parity

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The sidecar node: pod rpc/greeter-v2-0 of testdata/proxyless.yaml, which
// serves Service greeter (7070 → 8080, 9901) and is labelled for Istio
// mutual TLS.
const (
	sidecarNamespace = "rpc"
	sidecarPod       = "greeter-v2-0"
	sidecarAccount   = "greeter"
	sidecarIP        = "10.244.3.21"
)

var sidecarLabels = map[string]string{"app": "greeter", "version": "v2", "security.istio.io/tlsMode": "istio"}

// sidecarNode is the node Istio's agent sends for an Envoy sidecar of pod
// pod (wire contract: sidecar §1.5).
func sidecarNode(ns, pod, sa, ip string, labels map[string]string) (*corev3.Node, error) {
	lbls := map[string]any{}
	for k, v := range labels {
		lbls[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"ISTIO_VERSION": "1.32.0", "CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local",
		"NAME": pod, "NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "INSTANCE_IPS": ip, "LABELS": lbls,
		"INTERCEPTION_MODE": "REDIRECT", "WORKLOAD_NAME": "greeter-v2", "APP_CONTAINERS": "greeter", "NODE_NAME": "node-1",
		"POD_PORTS":         `[{"name":"grpc","containerPort":8080,"protocol":"TCP"}]`,
		"ENVOY_STATUS_PORT": 15021.0, "ENVOY_PROMETHEUS_PORT": 15090.0,
	})
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns), Cluster: "greeter." + ns, Metadata: md}, nil
}

// compareSidecar subscribes to both control planes as the Envoy sidecar of
// pod rpc/greeter-v2-0 and compares the names of all four types and their
// key fields (keyFields): a sidecar's resources carry much that only
// Istio's own Envoy extensions read (telemetry filters, peer metadata), so
// only what decides where traffic goes and how it is secured is compared.
// Differences testdata/sidecar-allowlist.yaml does not list fail.
func compareSidecar(t *testing.T, istiodAddr, canopyAddr string) {
	allowPath := filepath.Join("testdata", "sidecar-allowlist.yaml")
	allowList, err := readAllowList(allowPath, "Listener", "RouteConfiguration", "Cluster", "ClusterLoadAssignment")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	node, err := sidecarNode(sidecarNamespace, sidecarPod, sidecarAccount, sidecarIP, sidecarLabels)
	if err != nil {
		t.Fatal(err)
	}
	istiodConn, canopyConn, canopyMD := envoyConnections(t, istiodAddr, canopyAddr, sidecarNamespace, sidecarAccount)
	fromIstiod, err := subscribeSidecar(ctx, "istiod", istiodConn, node, metadata.MD{})
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("CANOPY_PARITY_DUMP")
	if dir != "" {
		waitQuiet(t, "istiod's sidecar view", fromIstiod)
		dumpView(t, filepath.Join(dir, "istiod-sidecar.json"), fromIstiod)
	}
	fromCanopy, err := subscribeSidecar(ctx, "canopy", canopyConn, node, canopyMD)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, "both sidecar views", fromIstiod, fromCanopy)
	if dir != "" {
		dumpView(t, filepath.Join(dir, "canopy-sidecar.json"), fromCanopy)
	}
	compareViews(t, "sidecar ", envoyTypes, keyFields{fromIstiod}, keyFields{fromCanopy}, allowList, allowPath)
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

// keyFields is a view of only the fields the sidecar comparison covers:
// a cluster's discovery type, load balancer, EDS service name and
// transport sockets; a listener's address, filter chain names and
// matches, transport sockets, network filter names, the route
// configuration or cluster each chain sends to (not the HTTP filters:
// Istio's own Envoy build has telemetry filters Canopy does not configure);
// a route configuration's
// virtual hosts (names, domains) and their routes' matches and
// destinations; endpoint assignments whole.
type keyFields struct{ view }

func (k keyFields) table(typ string) map[string]*anypb.Any {
	full := k.view.table(typ)
	out := make(map[string]*anypb.Any, len(full))
	for name, a := range full {
		m, err := decode(typ, a)
		if err != nil {
			out[name] = a // compareTables reports it
			continue
		}
		p, err := anypb.New(project(m))
		if err != nil {
			panic(err)
		}
		out[name] = p
	}
	return out
}

// project keeps a resource's key fields.
func project(m proto.Message) proto.Message {
	switch r := m.(type) {
	case *clusterv3.Cluster:
		c := &clusterv3.Cluster{
			Name: r.GetName(), ClusterDiscoveryType: r.GetClusterDiscoveryType(), LbPolicy: r.GetLbPolicy(),
			TransportSocket: r.GetTransportSocket(), TransportSocketMatches: r.GetTransportSocketMatches(),
		}
		if r.GetEdsClusterConfig() != nil {
			c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{ServiceName: r.GetEdsClusterConfig().GetServiceName()}
		}
		return c
	case *listenerv3.Listener:
		l := &listenerv3.Listener{Name: r.GetName(), Address: r.GetAddress(), TrafficDirection: r.GetTrafficDirection(),
			UseOriginalDst: r.GetUseOriginalDst(), BindToPort: r.GetBindToPort()}
		for _, lf := range r.GetListenerFilters() {
			l.ListenerFilters = append(l.ListenerFilters, &listenerv3.ListenerFilter{Name: lf.GetName()})
		}
		for _, fc := range r.GetFilterChains() {
			l.FilterChains = append(l.FilterChains, projectChain(fc))
		}
		if r.GetDefaultFilterChain() != nil {
			l.DefaultFilterChain = projectChain(r.GetDefaultFilterChain())
		}
		return l
	case *routev3.RouteConfiguration:
		rc := &routev3.RouteConfiguration{Name: r.GetName()}
		for _, vh := range r.GetVirtualHosts() {
			v := &routev3.VirtualHost{Name: vh.GetName(), Domains: vh.GetDomains()}
			for _, rt := range vh.GetRoutes() {
				p := &routev3.Route{Name: rt.GetName(), Match: rt.GetMatch()}
				switch a := rt.GetAction().(type) {
				case *routev3.Route_Route:
					p.Action = &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: a.Route.GetClusterSpecifier()}}
				default:
					p.Action = a
				}
				v.Routes = append(v.Routes, p)
			}
			rc.VirtualHosts = append(rc.VirtualHosts, v)
		}
		return rc
	case *endpointv3.ClusterLoadAssignment:
		// Within a locality the order of endpoints means nothing.
		cla := proto.Clone(r).(*endpointv3.ClusterLoadAssignment)
		for _, g := range cla.GetEndpoints() {
			slices.SortFunc(g.LbEndpoints, func(a, b *endpointv3.LbEndpoint) int {
				return strings.Compare(prototext.Format(a.GetEndpoint().GetAddress()), prototext.Format(b.GetEndpoint().GetAddress()))
			})
		}
		return cla
	}
	return m
}

// projectChain keeps a filter chain's name, match, transport socket and
// filter names, with the route configuration of a connection manager and
// the cluster of a TCP proxy.
func projectChain(fc *listenerv3.FilterChain) *listenerv3.FilterChain {
	out := &listenerv3.FilterChain{Name: fc.GetName(), FilterChainMatch: fc.GetFilterChainMatch(), TransportSocket: fc.GetTransportSocket()}
	for _, f := range fc.GetFilters() {
		pf := &listenerv3.Filter{Name: f.GetName()}
		var hcm hcmv3.HttpConnectionManager
		var tcp tcpproxyv3.TcpProxy
		switch {
		case f.GetTypedConfig().MessageIs(&hcm) && f.GetTypedConfig().UnmarshalTo(&hcm) == nil:
			k := &hcmv3.HttpConnectionManager{}
			if hcm.GetRds() != nil {
				k.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: hcm.GetRds().GetRouteConfigName()}}
			}
			pf.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyOf(k)}
		case f.GetTypedConfig().MessageIs(&tcp) && f.GetTypedConfig().UnmarshalTo(&tcp) == nil:
			pf.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyOf(&tcpproxyv3.TcpProxy{ClusterSpecifier: tcp.GetClusterSpecifier()})}
		}
		out.Filters = append(out.Filters, pf)
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
