package ambient

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// IstioProtocol is a Kubernetes Service port's protocol as Istio names it
// (wire contract §7.2), "" when nothing names it (its protocol is then
// detected):
//   - a UDP port is UDP;
//   - otherwise the appProtocol, when set, else the port name, decides:
//     the Kubernetes-defined appProtocols kubernetes.io/h2c (HTTP2),
//     kubernetes.io/ws (HTTP) and kubernetes.io/wss (HTTPS) first; a
//     "grpc-web" prefix is GRPC-Web; else the part before the first "-",
//     case-insensitive, is an Istio protocol name (IstioProtocolName);
//   - a port of no known protocol on one of the well-known ports 25, 53,
//     3306 and 27017 is TCP.
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
	if proto := IstioProtocolName(prefix); proto != "" {
		return proto
	}
	if wellKnownTCPPort(p.Port) {
		return "TCP"
	}
	return ""
}

// IstioProtocolName is one of Istio's port protocol names, matched
// case-insensitively, as Istio spells it (HTTP, HTTP2, GRPC, GRPC-Web,
// TCP, TLS, HTTPS, Mongo, Redis, MySQL, HTTP_PROXY, UDP); "" for a name
// that is no Istio protocol.
func IstioProtocolName(name string) string {
	switch strings.ToLower(name) {
	case "http":
		return "HTTP"
	case "http2":
		return "HTTP2"
	case "grpc":
		return "GRPC"
	case "grpc-web":
		return "GRPC-Web"
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
	return ""
}

// appProtocol is the workload API's name of an Istio protocol: protocols
// it cannot name (UDP, GRPC-Web, HTTP_PROXY, Mongo, Redis, MySQL) and
// detected ones are UNKNOWN.
func appProtocol(istio string) workloadapi.AppProtocol {
	switch istio {
	case "HTTP":
		return workloadapi.AppProtocol_HTTP11
	case "HTTP2":
		return workloadapi.AppProtocol_HTTP2
	case "GRPC":
		return workloadapi.AppProtocol_GRPC
	case "TCP":
		return workloadapi.AppProtocol_TCP
	case "TLS", "HTTPS":
		return workloadapi.AppProtocol_TLS
	}
	return workloadapi.AppProtocol_UNKNOWN
}

// servicePortAppProtocol is a Kubernetes Service port's Port.app_protocol.
func servicePortAppProtocol(p corev1.ServicePort) workloadapi.AppProtocol {
	return appProtocol(IstioProtocol(p))
}

// serviceEntryAppProtocol is a ServiceEntry port's Port.app_protocol, from
// its protocol field.
func serviceEntryAppProtocol(protocol string) workloadapi.AppProtocol {
	return appProtocol(IstioProtocolName(protocol))
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
