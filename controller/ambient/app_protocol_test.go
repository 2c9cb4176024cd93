package ambient

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// The wanted values are istiod's: toAppProtocolFromKube in
// pilot/pkg/serviceregistry/ambient/workloads.go maps the protocol that
// ConvertProtocol (pkg/config/kube/conversion.go) derives from a Service
// port, and toAppProtocolFromProtocol maps protocol.Parse
// (pkg/config/protocol/instance.go) of a ServiceEntry port's protocol:
// HTTP → HTTP11, HTTP2 → HTTP2, GRPC → GRPC, TLS and HTTPS → TLS, TCP → TCP,
// everything else (UDP, GRPC-Web, Mongo, Redis, MySQL, HTTP_PROXY,
// unknown) → UNKNOWN.
func TestServicePortAppProtocol(t *testing.T) {
	t.Parallel()
	const (
		unknown = workloadapi.AppProtocol_UNKNOWN
		http11  = workloadapi.AppProtocol_HTTP11
		http2   = workloadapi.AppProtocol_HTTP2
		grpc    = workloadapi.AppProtocol_GRPC
		tcp     = workloadapi.AppProtocol_TCP
		tls     = workloadapi.AppProtocol_TLS
	)
	for _, tt := range []struct {
		name string
		port corev1.ServicePort
		want workloadapi.AppProtocol
	}{
		{"name http prefix", corev1.ServicePort{Name: "http-web", Port: 80}, http11},
		{"name is case insensitive", corev1.ServicePort{Name: "HTTP2", Port: 80}, http2},
		{"name grpc", corev1.ServicePort{Name: "grpc", Port: 80}, grpc},
		{"name tcp", corev1.ServicePort{Name: "tcp-admin", Port: 9000}, tcp},
		{"name tls", corev1.ServicePort{Name: "tls-db", Port: 5432}, tls},
		{"name https", corev1.ServicePort{Name: "https", Port: 443}, tls},
		{"name grpc-web is not grpc", corev1.ServicePort{Name: "grpc-web-ui", Port: 80}, unknown},
		{"name grpc-web alone", corev1.ServicePort{Name: "GRPC-Web", Port: 80}, unknown},
		{"name grpcweb is unknown", corev1.ServicePort{Name: "grpcweb-x", Port: 80}, unknown},
		{"name h2c is not an Istio protocol", corev1.ServicePort{Name: "h2c", Port: 80}, unknown},
		{"name mongo", corev1.ServicePort{Name: "mongo", Port: 27018}, unknown},
		{"name udp on a tcp port", corev1.ServicePort{Name: "udp-x", Port: 80}, unknown},
		{"unnamed port", corev1.ServicePort{Port: 8080}, unknown},
		{"unknown name on a well-known port is tcp", corev1.ServicePort{Name: "db", Port: 3306}, tcp},
		{"well-known port smtp", corev1.ServicePort{Port: 25}, tcp},
		{"well-known port dns", corev1.ServicePort{Name: "dns", Port: 53}, tcp},
		{"well-known port mongodb", corev1.ServicePort{Port: 27017}, tcp},
		{"known name on a well-known port keeps it", corev1.ServicePort{Name: "http", Port: 3306}, http11},
		{"udp protocol", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolUDP}, unknown},
		{"udp protocol on a well-known port", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}, unknown},
		// ConvertProtocol treats only UDP apart; SCTP ports follow their name.
		{"sctp protocol follows the name", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolSCTP}, http11},
		{"appProtocol over the name", corev1.ServicePort{Name: "http-web", Port: 80, AppProtocol: ptr.To("tcp")}, tcp},
		{"appProtocol tls", corev1.ServicePort{Name: "x", Port: 80, AppProtocol: ptr.To("tls")}, tls},
		{"appProtocol https", corev1.ServicePort{Name: "x", Port: 80, AppProtocol: ptr.To("HTTPS")}, tls},
		{"appProtocol http2", corev1.ServicePort{Port: 80, AppProtocol: ptr.To("http2")}, http2},
		{"appProtocol grpc-web", corev1.ServicePort{Port: 80, AppProtocol: ptr.To("grpc-web")}, unknown},
		{"appProtocol kubernetes.io/h2c", corev1.ServicePort{Name: "web", Port: 82, AppProtocol: ptr.To("kubernetes.io/h2c")}, http2},
		{"appProtocol kubernetes.io/ws", corev1.ServicePort{Name: "web", Port: 80, AppProtocol: ptr.To("kubernetes.io/ws")}, http11},
		{"appProtocol kubernetes.io/wss", corev1.ServicePort{Name: "web", Port: 443, AppProtocol: ptr.To("kubernetes.io/wss")}, tls},
		{"appProtocol with a suffix", corev1.ServicePort{Port: 80, AppProtocol: ptr.To("http-legacy")}, http11},
		{"other appProtocol", corev1.ServicePort{Name: "http", Port: 80, AppProtocol: ptr.To("example.com/custom")}, unknown},
		{"other appProtocol on a well-known port", corev1.ServicePort{Port: 53, AppProtocol: ptr.To("example.com/dns")}, tcp},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := servicePortAppProtocol(tt.port); got != tt.want {
				t.Errorf("servicePortAppProtocol(%+v) = %s, want %s", tt.port, got, tt.want)
			}
		})
	}
}

func TestServiceEntryAppProtocol(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		protocol string
		want     workloadapi.AppProtocol
	}{
		{"HTTP", workloadapi.AppProtocol_HTTP11},
		{"http", workloadapi.AppProtocol_HTTP11},
		{"HTTP2", workloadapi.AppProtocol_HTTP2},
		{"GRPC", workloadapi.AppProtocol_GRPC},
		{"GRPC-Web", workloadapi.AppProtocol_UNKNOWN},
		{"TCP", workloadapi.AppProtocol_TCP},
		{"TLS", workloadapi.AppProtocol_TLS},
		{"HTTPS", workloadapi.AppProtocol_TLS},
		{"MONGO", workloadapi.AppProtocol_UNKNOWN},
		{"UDP", workloadapi.AppProtocol_UNKNOWN},
		{"HTTP_PROXY", workloadapi.AppProtocol_UNKNOWN},
		{"", workloadapi.AppProtocol_UNKNOWN},
	} {
		if got := serviceEntryAppProtocol(tt.protocol); got != tt.want {
			t.Errorf("serviceEntryAppProtocol(%q) = %s, want %s", tt.protocol, got, tt.want)
		}
	}
}
