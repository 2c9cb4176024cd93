package workloadapi

import (
	"fmt"
	"strconv"
	"strings"
)

// UIDKind says which source a workload UID names.
type UIDKind int

// The workload sources and their UID formats. Everything in angle brackets
// is a non-empty string; only the last part of a format may contain "/".
const (
	// KindPod: "<cluster>//Pod/<namespace>/<name>".
	KindPod UIDKind = iota + 1
	// KindWorkloadEntry: "<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>".
	KindWorkloadEntry
	// KindServiceEntry: "<cluster>/networking.istio.io/ServiceEntry/<namespace>/<name>/<endpoint address>".
	KindServiceEntry
	// KindEndpointSlice: "<cluster>/discovery.k8s.io/EndpointSlice/<namespace>/<slice>/<endpoint key>".
	KindEndpointSlice
	// KindNetworkGateway: "NetworkGateway/<network>/<gateway address>/<hbone port>".
	KindNetworkGateway
	// KindSplitHorizon: "<network>/SplitHorizonWorkload/<gateway address>/<namespace>/<hostname>".
	KindSplitHorizon
)

// String implements fmt.Stringer.
func (k UIDKind) String() string {
	switch k {
	case KindPod:
		return "Pod"
	case KindWorkloadEntry:
		return "WorkloadEntry"
	case KindServiceEntry:
		return "ServiceEntry"
	case KindEndpointSlice:
		return "EndpointSlice"
	case KindNetworkGateway:
		return "NetworkGateway"
	case KindSplitHorizon:
		return "SplitHorizonWorkload"
	default:
		return "UIDKind(" + strconv.Itoa(int(k)) + ")"
	}
}

// Fixed segments of the UID formats.
const (
	uidGroupCore         = ""
	uidGroupNetworking   = "networking.istio.io"
	uidGroupDiscovery    = "discovery.k8s.io"
	uidNetworkGateway    = "NetworkGateway"
	uidSplitHorizon      = "SplitHorizonWorkload"
	uidKindPod           = "Pod"
	uidKindWorkloadEntry = "WorkloadEntry"
	uidKindServiceEntry  = "ServiceEntry"
	uidKindEndpointSlice = "EndpointSlice"
)

// WorkloadUID is a parsed Workload.uid, the workload's xDS primary name.
// Which fields are set depends on Kind; see the Kind constants.
type WorkloadUID struct {
	Kind UIDKind
	// Cluster is the cluster ID of Kubernetes-sourced workloads.
	Cluster string
	// Network is the network of network-gateway and split-horizon workloads.
	Network string
	// Namespace is the object's namespace, or the split-horizon service's.
	Namespace string
	// Name is the Pod, WorkloadEntry, ServiceEntry or EndpointSlice name.
	Name string
	// Endpoint is a ServiceEntry endpoint address or an EndpointSlice
	// endpoint key.
	Endpoint string
	// Gateway is the address of a network gateway.
	Gateway string
	// Port is a network gateway's HBONE port.
	Port uint16
	// Hostname is a split-horizon workload's service hostname.
	Hostname string
}

// PodUID returns the UID of the workload for a pod.
func PodUID(cluster, namespace, name string) string {
	return WorkloadUID{Kind: KindPod, Cluster: cluster, Namespace: namespace, Name: name}.String()
}

// WorkloadEntryUID returns the UID of the workload for a WorkloadEntry.
func WorkloadEntryUID(cluster, namespace, name string) string {
	return WorkloadUID{Kind: KindWorkloadEntry, Cluster: cluster, Namespace: namespace, Name: name}.String()
}

// ServiceEntryUID returns the UID of the workload for one inline endpoint of a
// ServiceEntry, keyed by the endpoint's address.
func ServiceEntryUID(cluster, namespace, name, endpoint string) string {
	return WorkloadUID{Kind: KindServiceEntry, Cluster: cluster, Namespace: namespace, Name: name, Endpoint: endpoint}.String()
}

// EndpointSliceUID returns the UID of the workload for an EndpointSlice
// endpoint that has no pod behind it.
func EndpointSliceUID(cluster, namespace, slice, endpoint string) string {
	return WorkloadUID{Kind: KindEndpointSlice, Cluster: cluster, Namespace: namespace, Name: slice, Endpoint: endpoint}.String()
}

// NetworkGatewayUID returns the UID of an east-west network gateway.
func NetworkGatewayUID(network, gateway string, port uint16) string {
	return WorkloadUID{Kind: KindNetworkGateway, Network: network, Gateway: gateway, Port: port}.String()
}

// SplitHorizonUID returns the UID of the stand-in workload for a service
// reached through another network's gateway.
func SplitHorizonUID(network, gateway, namespace, hostname string) string {
	return WorkloadUID{Kind: KindSplitHorizon, Network: network, Gateway: gateway, Namespace: namespace, Hostname: hostname}.String()
}

// String returns the UID in its wire format. For a valid WorkloadUID,
// ParseWorkloadUID(u.String()) returns u.
func (u WorkloadUID) String() string {
	switch u.Kind {
	case KindPod:
		return join(u.Cluster, uidGroupCore, uidKindPod, u.Namespace, u.Name)
	case KindWorkloadEntry:
		return join(u.Cluster, uidGroupNetworking, uidKindWorkloadEntry, u.Namespace, u.Name)
	case KindServiceEntry:
		return join(u.Cluster, uidGroupNetworking, uidKindServiceEntry, u.Namespace, u.Name, u.Endpoint)
	case KindEndpointSlice:
		return join(u.Cluster, uidGroupDiscovery, uidKindEndpointSlice, u.Namespace, u.Name, u.Endpoint)
	case KindNetworkGateway:
		return join(uidNetworkGateway, u.Network, u.Gateway, strconv.Itoa(int(u.Port)))
	case KindSplitHorizon:
		return join(u.Network, uidSplitHorizon, u.Gateway, u.Namespace, u.Hostname)
	default:
		return ""
	}
}

func join(parts ...string) string { return strings.Join(parts, "/") }

// ParseWorkloadUID parses a workload UID in one of the formats of the Kind
// constants. It accepts exactly what WorkloadUID.String produces.
func ParseWorkloadUID(s string) (WorkloadUID, error) {
	u, err := parseWorkloadUID(s)
	if err != nil {
		return WorkloadUID{}, fmt.Errorf("%w: workload uid %q: %w", ErrMalformedName, s, err)
	}
	return u, nil
}

func parseWorkloadUID(s string) (WorkloadUID, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 4 {
		return WorkloadUID{}, fmt.Errorf("want at least 4 parts separated by %q, got %d", "/", len(parts))
	}
	if kind, n, ok := kubeKind(parts[1], parts[2]); ok {
		if n == 5 {
			p, err := fields(s, 5, false, "cluster", "", "", "namespace", "name")
			if err != nil {
				return WorkloadUID{}, err
			}
			return WorkloadUID{Kind: kind, Cluster: p[0], Namespace: p[3], Name: p[4]}, nil
		}
		// Endpoint addresses may hold "/" (a unix socket path), so the
		// endpoint is the rest of the UID.
		p, err := fields(s, 6, true, "cluster", "", "", "namespace", "name", "endpoint")
		if err != nil {
			return WorkloadUID{}, err
		}
		return WorkloadUID{Kind: kind, Cluster: p[0], Namespace: p[3], Name: p[4], Endpoint: p[5]}, nil
	}
	switch {
	case parts[1] == uidSplitHorizon:
		p, err := fields(s, 5, false, "network", "", "gateway", "namespace", "hostname")
		if err != nil {
			return WorkloadUID{}, err
		}
		return WorkloadUID{Kind: KindSplitHorizon, Network: p[0], Gateway: p[2], Namespace: p[3], Hostname: p[4]}, nil
	case parts[0] == uidNetworkGateway:
		p, err := fields(s, 4, false, "", "network", "gateway", "port")
		if err != nil {
			return WorkloadUID{}, err
		}
		port, err := strconv.ParseUint(p[3], 10, 16)
		if err != nil || port == 0 || strconv.FormatUint(port, 10) != p[3] {
			return WorkloadUID{}, fmt.Errorf("gateway port %q is not a port number", p[3])
		}
		return WorkloadUID{Kind: KindNetworkGateway, Network: p[1], Gateway: p[2], Port: uint16(port)}, nil
	}
	return WorkloadUID{}, fmt.Errorf("unknown source %q", parts[1]+"/"+parts[2])
}

// kubeKind maps the group and kind segments of a cluster-scoped UID to its
// kind and number of parts.
func kubeKind(group, kind string) (UIDKind, int, bool) {
	switch {
	case group == uidGroupCore && kind == uidKindPod:
		return KindPod, 5, true
	case group == uidGroupNetworking && kind == uidKindWorkloadEntry:
		return KindWorkloadEntry, 5, true
	case group == uidGroupNetworking && kind == uidKindServiceEntry:
		return KindServiceEntry, 6, true
	case group == uidGroupDiscovery && kind == uidKindEndpointSlice:
		return KindEndpointSlice, 6, true
	}
	return 0, 0, false
}

// fields splits s into exactly n parts and checks that each named part is
// non-empty; unnamed parts are fixed segments the caller has matched. With
// openEnded the last part keeps any further "/".
func fields(s string, n int, openEnded bool, names ...string) ([]string, error) {
	var p []string
	if openEnded {
		p = strings.SplitN(s, "/", n)
	} else {
		p = strings.Split(s, "/")
	}
	if len(p) != n {
		return nil, fmt.Errorf("want %d parts separated by %q, got %d", n, "/", len(p))
	}
	for i, name := range names {
		if name != "" && p[i] == "" {
			return nil, fmt.Errorf("empty %s", name)
		}
	}
	return p, nil
}
