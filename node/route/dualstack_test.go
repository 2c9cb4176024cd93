package route

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// A dual-stack pod is reached over the family the client used.
func TestDecideKeepsTheFamily(t *testing.T) {
	t.Parallel()
	src := wl{name: "client", ip: "10.244.1.2", proto: workloadapi.TunnelProtocol_HBONE, healthy: true}.build()
	dual := wl{name: "web", ip: "10.244.1.5", proto: workloadapi.TunnelProtocol_HBONE, healthy: true, services: ports(80, 8080)}.build()
	dual.Addresses = append(dual.Addresses, netip.MustParseAddr("fd00:10:244::5").AsSlice())
	svc := service("10.96.0.10", 80, 8080, nil, nil)
	svc.Addresses = append(svc.Addresses, &workloadapi.NetworkAddress{Address: netip.MustParseAddr("fd00:10:96::10").AsSlice()})
	tbl := table(t, svc, dual)
	for _, tt := range []struct {
		dst  string
		want Route
	}{
		{"10.244.1.5:8080", Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: dual, Identities: []workloadapi.Identity{id("web")}}},
		{"[fd00:10:244::5]:8080", Route{Kind: HBONE, Addr: ap("[fd00:10:244::5]:15008"), Authority: "[fd00:10:244::5]:8080", Workload: dual, Identities: []workloadapi.Identity{id("web")}}},
		{"[fd00:10:96::10]:80", Route{Kind: HBONE, Addr: ap("[fd00:10:244::5]:15008"), Authority: "[fd00:10:244::5]:8080", Workload: dual, Identities: []workloadapi.Identity{id("web")}}},
		{"10.96.0.10:80", Route{Kind: HBONE, Addr: ap("10.244.1.5:15008"), Authority: "10.244.1.5:8080", Workload: dual, Identities: []workloadapi.Identity{id("web")}}},
	} {
		got, err := Decide(tbl, src, ap(tt.dst), func(int) int { return 0 })
		if err != nil {
			t.Fatalf("Decide(%s): %v", tt.dst, err)
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.AddrPort{}), cmp.Comparer(proto.Equal)); diff != "" {
			t.Errorf("Decide(%s) mismatch (-want +got):\n%s", tt.dst, diff)
		}
	}
}
