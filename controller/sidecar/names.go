package sidecar

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Traffic directions as cluster names spell them.
const (
	Outbound = "outbound"
	Inbound  = "inbound"
)

// ClusterName is "<direction>|<port>|<subset>|<hostname>", the name of a
// cluster and of its endpoint assignment (wire contract: sidecar §2.1).
func ClusterName(direction string, port uint32, subset, hostname string) string {
	return direction + "|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + hostname
}

// ClusterKey is a parsed cluster name.
type ClusterKey struct {
	Direction string
	Port      uint32
	Subset    string
	Hostname  string
}

// String is the key's cluster name.
func (k ClusterKey) String() string { return ClusterName(k.Direction, k.Port, k.Subset, k.Hostname) }

// ParseClusterName parses a cluster name of ClusterName's form; a proxy
// asks for any string, so every part is checked, and only the form
// ClusterName writes parses: one name for one cluster (what the mesh has
// is cached by name, and "outbound|080|..." would be another).
//
// It allocates nothing for a valid name: the generators parse every name
// a proxy asks for, on every push.
func ParseClusterName(name string) (ClusterKey, error) {
	dir, rest, ok1 := strings.Cut(name, "|")
	portText, rest, ok2 := strings.Cut(rest, "|")
	subset, host, ok3 := strings.Cut(rest, "|")
	if !ok1 || !ok2 || !ok3 || strings.Contains(host, "|") {
		return ClusterKey{}, fmt.Errorf("cluster name %q: want direction|port|subset|hostname", name)
	}
	if dir != Outbound && dir != Inbound {
		return ClusterKey{}, fmt.Errorf("cluster name %q: unknown direction %q", name, dir)
	}
	port, err := parsePort(portText)
	if err != nil {
		return ClusterKey{}, fmt.Errorf("cluster name %q: %w", name, err)
	}
	if dir == Outbound && host == "" {
		return ClusterKey{}, fmt.Errorf("cluster name %q: no hostname", name)
	}
	return ClusterKey{Direction: dir, Port: port, Subset: subset, Hostname: host}, nil
}

// ServerListenerPrefix starts the name of a proxyless gRPC server's
// listener, "xds.istio.io/grpc/lds/inbound/<ip>:<port>".
const ServerListenerPrefix = "xds.istio.io/grpc/lds/inbound/"

// hostPort splits "host:port" (or "[v6]:port"); a name without a port
// returns port 0.
func hostPort(name string) (string, uint32, error) {
	h, p, err := net.SplitHostPort(name)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return name, 0, nil
		}
		return "", 0, fmt.Errorf("listener name %q: %w", name, err)
	}
	port, err := parsePort(p)
	if err != nil {
		return "", 0, fmt.Errorf("listener name %q: %w", name, err)
	}
	return h, port, nil
}

// fqdn expands a name as a client in namespace ns would mean it:
// "reviews" and "reviews.<ns>" and "reviews.<ns>.svc" are
// "reviews.<ns>.svc.<domain>"; anything else is taken as written.
func fqdn(name, ns, domain string) string {
	if !strings.Contains(name, ".") {
		return name + "." + ns + ".svc." + domain
	}
	for _, suffix := range []string{"." + ns, "." + ns + ".svc"} {
		if short, ok := strings.CutSuffix(name, suffix); ok && !strings.Contains(short, ".") {
			return short + "." + ns + ".svc." + domain
		}
	}
	return name
}

// Type URLs of the Envoy resources the generators build.
const (
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	ListenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	RouteType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
)

// Generate answers names of typeURL for a proxyless gRPC client: the
// resources found, each under the name it answers.
func (m *Mesh) Generate(p Proxy, typeURL string, names []string) []Named {
	return generateAll(m.GRPCShares(p, typeURL, names))
}

// parsePort parses a port number (1-65535) as names write it, without
// leading zeros: a name that means what another means is no name of the
// mesh's, or a client could make up any number of names for what the mesh
// has.
func parsePort(s string) (uint32, error) {
	port, err := strconv.ParseUint(s, 10, 16)
	if err != nil || port == 0 || s[0] == '0' {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return uint32(port), nil
}
