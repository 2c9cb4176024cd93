package sidecar

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestLocalityLoadBalancing: an assignment's localities are prioritised or
// weighed relative to the proxy's place as istiod does it.
func TestLocalityLoadBalancing(t *testing.T) {
	// One endpoint per locality, labelled with its version.
	group := func(region, zone, subzone, version string) localityGroup {
		w := &workloadapi.Workload{Locality: &workloadapi.Locality{Region: region, Zone: zone, Subzone: subzone}}
		return localityGroup{
			lb: &endpointv3.LocalityLbEndpoints{
				Locality:            &corev3.Locality{Region: region, Zone: zone, SubZone: subzone},
				LbEndpoints:         []*endpointv3.LbEndpoint{{LoadBalancingWeight: wrapperspb.UInt32(1)}},
				LoadBalancingWeight: wrapperspb.UInt32(1),
			},
			endpoints: []Endpoint{{Workload: w, Labels: map[string]string{"version": version}}},
		}
	}
	groups := func() []localityGroup {
		return []localityGroup{
			group("us-east1", "b", "rack-7", "v1"),
			group("us-east1", "b", "rack-8", "v2"),
			group("us-east1", "c", "", "v1"),
			group("us-west1", "a", "", "v1"),
			group("eu-west1", "a", "", "v1"),
		}
	}
	place := proxyPlace{
		locality: &corev3.Locality{Region: "us-east1", Zone: "b", SubZone: "rack-7"},
		labels:   map[string]string{"version": "v1", labelRegion: "us-east1", labelZone: "b"},
	}
	type got struct {
		Locality string
		Priority uint32
		Weight   uint32
		Count    int
	}
	summarize := func(lbs []*endpointv3.LocalityLbEndpoints) []got {
		var out []got
		for _, l := range lbs {
			out = append(out, got{l.GetLocality().GetRegion() + "/" + l.GetLocality().GetZone(), l.GetPriority(), l.GetLoadBalancingWeight().GetValue(), len(l.GetLbEndpoints())})
		}
		return out
	}
	for _, tt := range []struct {
		name    string
		setting localitySetting
		outlier bool
		want    []got
	}{
		{
			name: "no outlier detection: nothing", setting: localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{}},
			want: []got{{"us-east1/b", 0, 1, 1}, {"us-east1/b", 0, 1, 1}, {"us-east1/c", 0, 1, 1}, {"us-west1/a", 0, 1, 1}, {"eu-west1/a", 0, 1, 1}},
		},
		{
			name: "failover by locality", setting: localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{}}, outlier: true,
			want: []got{{"us-east1/b", 0, 1, 1}, {"us-east1/b", 1, 1, 1}, {"us-east1/c", 2, 1, 1}, {"us-west1/a", 3, 1, 1}, {"eu-west1/a", 3, 1, 1}},
		},
		{
			name: "failover to a named region", outlier: true,
			setting: localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{Failover: []*networkingapi.LocalityLoadBalancerSetting_Failover{{From: "us-east1", To: "us-west1"}}}},
			want:    []got{{"us-east1/b", 0, 1, 1}, {"us-east1/b", 1, 1, 1}, {"us-east1/c", 2, 1, 1}, {"us-west1/a", 3, 1, 1}, {"eu-west1/a", 4, 1, 1}},
		},
		{
			name: "distribute", outlier: true,
			setting: localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{Distribute: []*networkingapi.LocalityLoadBalancerSetting_Distribute{
				{From: "us-east1/*", To: map[string]uint32{"us-east1/b/*": 60, "us-west1/*": 40}},
			}}},
			want: []got{{"us-east1/b", 0, 30, 1}, {"us-east1/b", 0, 30, 1}, {"us-east1/c", 0, 1, 0}, {"us-west1/a", 0, 40, 1}, {"eu-west1/a", 0, 1, 0}},
		},
		{
			name: "failover priority by labels, forced", setting: localitySetting{force: true, locality: &networkingapi.LocalityLoadBalancerSetting{FailoverPriority: []string{"version", labelRegion}}},
			want: []got{{"us-east1/b", 0, 1, 1}, {"us-east1/b", 2, 1, 1}, {"us-east1/c", 0, 1, 1}, {"us-west1/a", 1, 1, 1}, {"eu-west1/a", 1, 1, 1}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, summarize(applyLocality(groups(), place, tt.setting, tt.outlier))); diff != "" {
				t.Errorf("localities (-want +got):\n%s", diff)
			}
		})
	}
}
