package xds

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrMalformedNode is wrapped by every node parsing error; the server
// answers it with InvalidArgument.
var ErrMalformedNode = errors.New("malformed node")

// Proxy is a connected proxy as its xDS node describes it
// (wire contract §2.2).
type Proxy struct {
	// ID is the whole node ID, "<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>".
	ID string
	// Type is "ztunnel", "sidecar" or "router".
	Type string
	// IP is the node ID's fallback IP.
	IP netip.Addr
	// ProxyID is "<pod>.<namespace>", the name proxy status shows.
	ProxyID string
	// Name and Namespace are the proxy's pod: the metadata's NAME and
	// NAMESPACE, else the ID's.
	Name, Namespace string
	// DNSDomain is the ID's last part.
	DNSDomain string

	// From the metadata.
	NodeName       string
	ClusterID      string
	IstioVersion   string
	ServiceAccount string
	InstanceIPs    []netip.Addr
	// Generator is "grpc" for a proxyless gRPC client.
	Generator string
	// Labels are the proxy's workload labels (metadata LABELS).
	Labels map[string]string
	// Metadata is the node's metadata as sent, for proxy status.
	Metadata *structpb.Struct
}

// Node ID and metadata bounds. The transport bounds a request's size; these
// keep what one connection holds for its lifetime small.
const (
	maxNodeIDLen    = 1024
	maxMetadataKeys = 256
)

// ParseNode parses and checks an xDS node (wire contract §2.2). The namespace
// is the metadata's NAMESPACE, else the ID's; it is what the caller's
// identity is checked against.
func ParseNode(n *corev3.Node) (Proxy, error) {
	p, err := parseNode(n)
	if err != nil {
		return Proxy{}, fmt.Errorf("%w: %w", ErrMalformedNode, err)
	}
	return p, nil
}

func parseNode(n *corev3.Node) (Proxy, error) {
	if n == nil || n.GetId() == "" {
		return Proxy{}, errors.New("the first request carries no node ID")
	}
	id := n.GetId()
	if len(id) > maxNodeIDLen {
		return Proxy{}, fmt.Errorf("node ID of %d bytes, limit %d", len(id), maxNodeIDLen)
	}
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return Proxy{}, fmt.Errorf("node ID %q: want 4 parts separated by ~, got %d", id, len(parts))
	}
	p := Proxy{ID: id, Type: parts[0], ProxyID: parts[2], DNSDomain: parts[3]}
	switch p.Type {
	case "ztunnel", "sidecar", "router":
	default:
		return Proxy{}, fmt.Errorf("node ID %q: unknown proxy type %q (want ztunnel, sidecar or router)", id, p.Type)
	}
	ip, err := netip.ParseAddr(parts[1])
	if err != nil {
		return Proxy{}, fmt.Errorf("node ID %q: IP: %w", id, err)
	}
	p.IP = ip
	// Namespaces have no dots, pod names may: the namespace follows the
	// last dot.
	dot := strings.LastIndexByte(p.ProxyID, '.')
	if dot <= 0 || dot == len(p.ProxyID)-1 {
		return Proxy{}, fmt.Errorf("node ID %q: proxy ID %q is not <pod>.<namespace>", id, p.ProxyID)
	}
	p.Name, p.Namespace = p.ProxyID[:dot], p.ProxyID[dot+1:]
	if p.DNSDomain == "" {
		return Proxy{}, fmt.Errorf("node ID %q: empty DNS domain", id)
	}

	md := n.GetMetadata()
	if len(md.GetFields()) > maxMetadataKeys {
		return Proxy{}, fmt.Errorf("metadata has %d keys, limit %d", len(md.GetFields()), maxMetadataKeys)
	}
	str := func(key string) (string, error) {
		v, ok := md.GetFields()[key]
		if !ok {
			return "", nil
		}
		s, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return "", fmt.Errorf("metadata %s is not a string", key)
		}
		return s.StringValue, nil
	}
	fields := []struct {
		key string
		dst *string
	}{
		{"NODE_NAME", &p.NodeName}, {"CLUSTER_ID", &p.ClusterID},
		{"ISTIO_VERSION", &p.IstioVersion}, {"SERVICE_ACCOUNT", &p.ServiceAccount},
		{"GENERATOR", &p.Generator},
	}
	for _, f := range fields {
		if *f.dst, err = str(f.key); err != nil {
			return Proxy{}, err
		}
	}
	// As istiod does, the metadata's NAMESPACE (and NAME) win over the ID:
	// debugging clients such as istioctl send a placeholder ID.
	for _, f := range []struct {
		key string
		dst *string
	}{{"NAMESPACE", &p.Namespace}, {"NAME", &p.Name}} {
		v, err := str(f.key)
		if err != nil {
			return Proxy{}, err
		}
		if v != "" {
			*f.dst = v
		}
	}
	ips, err := str("INSTANCE_IPS")
	if err != nil {
		return Proxy{}, err
	}
	for s := range strings.SplitSeq(ips, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return Proxy{}, fmt.Errorf("metadata INSTANCE_IPS: %w", err)
		}
		p.InstanceIPs = append(p.InstanceIPs, a)
	}
	if v, ok := md.GetFields()["LABELS"]; ok {
		lbls := v.GetStructValue()
		if lbls == nil {
			return Proxy{}, errors.New("metadata LABELS is not an object")
		}
		if len(lbls.GetFields()) > maxMetadataKeys {
			return Proxy{}, fmt.Errorf("metadata LABELS has %d keys, limit %d", len(lbls.GetFields()), maxMetadataKeys)
		}
		p.Labels = make(map[string]string, len(lbls.GetFields()))
		for k, lv := range lbls.GetFields() {
			s, ok := lv.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return Proxy{}, fmt.Errorf("metadata LABELS[%q] is not a string", k)
			}
			p.Labels[k] = s.StringValue
		}
	}
	p.Metadata = md
	return p, nil
}
