package route

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func TestDecideRefusesTheProxyItself(t *testing.T) {
	t.Parallel()
	hbone := workloadapi.TunnelProtocol_HBONE
	src := wl{name: "client", ip: "10.244.1.2", node: "n1", proto: hbone, healthy: true}.build()
	pod := wl{name: "web", ip: "10.244.1.5", node: "n1", proto: hbone, healthy: true, services: ports(80, 8080)}.build()
	toProxy := wl{name: "web", ip: "10.244.1.5", node: "n1", proto: hbone, healthy: true, services: ports(80, 15006)}.build()
	for _, tt := range []struct {
		name    string
		svc     *workloadapi.Service
		ws      []*workloadapi.Workload
		dst     string
		wantErr bool
	}{
		{name: "own address, outbound port", dst: "10.244.1.2:15001", wantErr: true},
		{name: "own address, every proxy port", dst: "10.244.1.2:15053", wantErr: true},
		{name: "own address, an app port", dst: "10.244.1.2:8080"},
		{name: "mesh pod, HBONE port", ws: []*workloadapi.Workload{pod}, dst: "10.244.1.5:15008", wantErr: true},
		{name: "mesh pod, inbound port", ws: []*workloadapi.Workload{pod}, dst: "10.244.1.5:15006", wantErr: true},
		{name: "mesh pod, admin port", ws: []*workloadapi.Workload{pod}, dst: "10.244.1.5:15000", wantErr: true},
		{name: "mesh pod, app port", ws: []*workloadapi.Workload{pod}, dst: "10.244.1.5:8080"},
		{name: "service VIP on a proxy port", svc: service("10.96.0.10", 15001, 8080, nil, nil), ws: []*workloadapi.Workload{pod}, dst: "10.96.0.10:15001", wantErr: true},
		{name: "service whose target is a proxy port", svc: service("10.96.0.10", 80, 15006, nil, nil), ws: []*workloadapi.Workload{toProxy}, dst: "10.96.0.10:80", wantErr: true},
		{name: "outside the mesh may use the port", dst: "192.0.2.1:15021"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decide(table(t, tt.svc, tt.ws...), src, ap(tt.dst), func(int) int { return 0 })
			if got := errors.Is(err, ErrSelfCall); got != tt.wantErr {
				t.Errorf("Decide(%s) error = %v, want a self call: %v", tt.dst, err, tt.wantErr)
			}
		})
	}
}

func TestCheckInbound(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		dst     string
		wantErr bool
	}{
		{"10.244.1.5:15001", true}, {"10.244.1.5:15006", true}, {"10.244.1.5:15008", true},
		{"10.244.1.5:15053", true}, {"10.244.1.5:15000", true}, {"10.244.1.5:15020", true},
		{"10.244.1.5:15021", true}, {"10.244.1.5:8080", false}, {"[fd00::5]:15001", true},
	} {
		if err := CheckInbound(netip.MustParseAddrPort(tt.dst)); errors.Is(err, ErrSelfCall) != tt.wantErr {
			t.Errorf("CheckInbound(%s) = %v, want a self call: %v", tt.dst, err, tt.wantErr)
		}
	}
}
