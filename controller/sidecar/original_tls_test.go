package sidecar

import (
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestOriginalDestinationMutualTLS: a cluster to an original destination
// (a headless Service, a PASSTHROUGH rule) takes mutual TLS exactly when
// every endpoint of the port has a sidecar and the namespace does not
// disable it; never plaintext to sidecars because the load balancer is
// the client's.
func TestOriginalDestinationMutualTLS(t *testing.T) {
	ports := map[string][]uint32{"a/db.a.svc.cluster.local": {5432}, "a/web.a.svc.cluster.local": {80}}
	mesh := func(labelled []string, paMode securityapi.PeerAuthentication_MutualTLS_Mode) *Mesh {
		lbls := map[string]map[string]string{}
		for _, name := range labelled {
			lbls[workloadapi.PodUID("Kubernetes", "a", name)] = map[string]string{tlsModeLabel: "istio"}
		}
		in := Inputs{
			Addresses: []*workloadapi.Address{
				withProtocol(svc("a", "db", "", 5432), workloadapi.AppProtocol_TCP),
				withProtocol(svc("a", "web", "10.96.0.20", 80), workloadapi.AppProtocol_HTTP11),
				pod("a", "db-0-aa", "10.244.0.1", "", ports), pod("a", "db-1-bb", "10.244.0.2", "", ports),
			},
			Labels: func(uid string) map[string]string { return lbls[uid] },
			DestinationRules: []*networkingv1.DestinationRule{{ObjectMeta: meta("a", "web", time.Hour), Spec: networkingapi.DestinationRule{
				Host: "web", TrafficPolicy: &networkingapi.TrafficPolicy{LoadBalancer: &networkingapi.LoadBalancerSettings{
					LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_PASSTHROUGH},
				}},
			}}},
		}
		if paMode != securityapi.PeerAuthentication_MutualTLS_UNSET {
			in.PeerAuthentications = []*securityv1.PeerAuthentication{{ObjectMeta: meta("a", "default", time.Hour),
				Spec: securityapi.PeerAuthentication{Mtls: &securityapi.PeerAuthentication_MutualTLS{Mode: paMode}}}}
		}
		return NewMesh(in)
	}
	tlsOf := func(m *Mesh, name string) string {
		for _, n := range m.SidecarClusters(Proxy{Namespace: "b", HBONE: true}) {
			if n.Name == name {
				return n.Resource.(*clusterv3.Cluster).GetTransportSocket().GetName()
			}
		}
		t.Fatalf("no cluster %s", name)
		return ""
	}
	both := []string{"db-0-aa", "db-1-bb"}
	for _, tt := range []struct {
		name     string
		labelled []string
		pa       securityapi.PeerAuthentication_MutualTLS_Mode
		want     string // the transport socket's name; "" for none
	}{
		{"all with sidecars", both, securityapi.PeerAuthentication_MutualTLS_UNSET, "envoy.transport_sockets.tls"},
		{"STRICT namespace", both, securityapi.PeerAuthentication_MutualTLS_STRICT, "envoy.transport_sockets.tls"},
		{"one without a sidecar", both[:1], securityapi.PeerAuthentication_MutualTLS_UNSET, ""},
		{"namespace disables it", both, securityapi.PeerAuthentication_MutualTLS_DISABLE, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := mesh(tt.labelled, tt.pa)
			for _, c := range []string{"outbound|5432||db.a.svc.cluster.local", "outbound|80||web.a.svc.cluster.local"} {
				if got := tlsOf(m, c); got != tt.want {
					t.Errorf("%s: transport socket %q, want %q", c, got, tt.want)
				}
			}
		})
	}
}
