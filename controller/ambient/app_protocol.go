package ambient

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// servicePortAppProtocol is a Kubernetes Service port's Port.app_protocol,
// as Istio derives a port's protocol (wire contract §7.2):
//   - a UDP port has none;
//   - otherwise the appProtocol, when set, else the port name, decides:
//     the Kubernetes-defined appProtocols kubernetes.io/h2c (HTTP/2),
//     kubernetes.io/ws (HTTP/1.1) and kubernetes.io/wss (TLS) first; a
//     "grpc-web" prefix is gRPC-Web, which the workload API cannot name;
//     else the part before the first "-", case-insensitive, is an Istio
//     protocol name;
//   - a port of no known protocol on one of the well-known ports 25, 53,
//     3306 and 27017 is TCP.
func servicePortAppProtocol(p corev1.ServicePort) workloadapi.AppProtocol {
	if p.Protocol == corev1.ProtocolUDP {
		return workloadapi.AppProtocol_UNKNOWN
	}
	name := p.Name
	if p.AppProtocol != nil {
		name = *p.AppProtocol
		switch name {
		case "kubernetes.io/h2c":
			return workloadapi.AppProtocol_HTTP2
		case "kubernetes.io/ws":
			return workloadapi.AppProtocol_HTTP11
		case "kubernetes.io/wss":
			return workloadapi.AppProtocol_TLS
		}
	}
	const grpcWeb = "grpc-web"
	if len(name) >= len(grpcWeb) && strings.EqualFold(name[:len(grpcWeb)], grpcWeb) {
		return workloadapi.AppProtocol_UNKNOWN
	}
	prefix, _, _ := strings.Cut(name, "-")
	proto, known := istioProtocol(prefix)
	if !known && wellKnownTCPPort(p.Port) {
		return workloadapi.AppProtocol_TCP
	}
	return proto
}

// serviceEntryAppProtocol is a ServiceEntry port's Port.app_protocol, from
// its protocol field.
func serviceEntryAppProtocol(protocol string) workloadapi.AppProtocol {
	proto, _ := istioProtocol(protocol)
	return proto
}

// istioProtocol maps one of Istio's port protocol names (case-insensitive)
// to the workload API's; known is false for a name that is no Istio
// protocol. Known protocols the workload API cannot name (UDP, GRPC-Web,
// HTTP_PROXY, Mongo, Redis, MySQL) are UNKNOWN.
func istioProtocol(name string) (proto workloadapi.AppProtocol, known bool) {
	switch strings.ToLower(name) {
	case "http":
		return workloadapi.AppProtocol_HTTP11, true
	case "http2":
		return workloadapi.AppProtocol_HTTP2, true
	case "grpc":
		return workloadapi.AppProtocol_GRPC, true
	case "tcp":
		return workloadapi.AppProtocol_TCP, true
	case "tls", "https":
		return workloadapi.AppProtocol_TLS, true
	case "udp", "grpc-web", "http_proxy", "mongo", "redis", "mysql":
		return workloadapi.AppProtocol_UNKNOWN, true
	}
	return workloadapi.AppProtocol_UNKNOWN, false
}

// wellKnownTCPPort reports the ports Istio treats as TCP when nothing names
// their protocol: SMTP, DNS, MySQL and MongoDB.
func wellKnownTCPPort(port int32) bool {
	switch port {
	case 25, 53, 3306, 27017:
		return true
	}
	return false
}

// IstioProtocol is a Kubernetes Service port's protocol as Istio names it
// (HTTP, HTTP2, GRPC, GRPC-Web, TCP, TLS, HTTPS, Mongo, Redis, MySQL,
// HTTP_PROXY, UDP), by the same rules as servicePortAppProtocol; "" when
// nothing names it (its protocol is then detected).
func IstioProtocol(p corev1.ServicePort) string {
	if p.Protocol == corev1.ProtocolUDP {
		return "UDP"
	}
	name := p.Name
	if p.AppProtocol != nil {
		name = *p.AppProtocol
		switch name {
		case "kubernetes.io/h2c":
			return "HTTP2"
		case "kubernetes.io/ws":
			return "HTTP"
		case "kubernetes.io/wss":
			return "HTTPS"
		}
	}
	const grpcWeb = "grpc-web"
	if len(name) >= len(grpcWeb) && strings.EqualFold(name[:len(grpcWeb)], grpcWeb) {
		return "GRPC-Web"
	}
	prefix, _, _ := strings.Cut(name, "-")
	switch strings.ToLower(prefix) {
	case "http":
		return "HTTP"
	case "http2":
		return "HTTP2"
	case "grpc":
		return "GRPC"
	case "tcp":
		return "TCP"
	case "tls":
		return "TLS"
	case "https":
		return "HTTPS"
	case "mongo":
		return "Mongo"
	case "redis":
		return "Redis"
	case "mysql":
		return "MySQL"
	case "http_proxy":
		return "HTTP_PROXY"
	case "udp":
		return "UDP"
	}
	if wellKnownTCPPort(p.Port) {
		return "TCP"
	}
	return ""
}
