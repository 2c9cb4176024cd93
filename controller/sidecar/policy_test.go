package sidecar

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// TestClusterPolicy: port-level settings replace the policy's four fields
// as a whole, at the rule's level and at a subset's.
func TestClusterPolicy(t *testing.T) {
	t.Parallel()
	leastRequest := &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_LEAST_REQUEST}}
	pool := func(n int32) *networkingapi.ConnectionPoolSettings {
		return &networkingapi.ConnectionPoolSettings{Http: &networkingapi.ConnectionPoolSettings_HTTPSettings{Http2MaxRequests: n}}
	}
	mutual := &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_ISTIO_MUTUAL}
	dr := &networkingv1.DestinationRule{Spec: networkingapi.DestinationRule{
		Host: "reviews",
		TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: leastRequest, ConnectionPool: pool(100),
			PortLevelSettings: []*networkingapi.TrafficPolicy_PortTrafficPolicy{{Port: &networkingapi.PortSelector{Number: 9090}, ConnectionPool: pool(50)}},
		},
		Subsets: []*networkingapi.Subset{
			{Name: "tls", TrafficPolicy: &networkingapi.TrafficPolicy{Tls: mutual}},
			{Name: "ported", TrafficPolicy: &networkingapi.TrafficPolicy{
				Tls:               mutual,
				PortLevelSettings: []*networkingapi.TrafficPolicy_PortTrafficPolicy{{Port: &networkingapi.PortSelector{Number: 9080}, ConnectionPool: pool(10)}},
			}},
		},
	}}
	for _, tt := range []struct {
		name   string
		port   uint32
		subset string
		want   *networkingapi.TrafficPolicy
		wantOK bool
	}{
		{"rule (port-level settings ignored in the comparison)", 9080, "", &networkingapi.TrafficPolicy{LoadBalancer: leastRequest, ConnectionPool: pool(100)}, true},
		{"rule port level drops the load balancer", 9090, "", &networkingapi.TrafficPolicy{ConnectionPool: pool(50)}, true},
		{"subset adds TLS", 9080, "tls", &networkingapi.TrafficPolicy{LoadBalancer: leastRequest, ConnectionPool: pool(100), Tls: mutual}, true},
		{"subset port level replaces all four", 9080, "ported", &networkingapi.TrafficPolicy{ConnectionPool: pool(10)}, true},
		{"subset without port level on another port", 9090, "ported", &networkingapi.TrafficPolicy{ConnectionPool: pool(50), Tls: mutual}, true},
		{"no such subset", 9080, "nosuch", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := clusterPolicy(dr, tt.port, tt.subset)
			if ok != tt.wantOK {
				t.Fatalf("clusterPolicy() ok = %v, want %v", ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), protocmp.IgnoreFields(&networkingapi.TrafficPolicy{}, "port_level_settings")); diff != "" {
				t.Errorf("clusterPolicy() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
