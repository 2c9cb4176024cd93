package ambient

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestWaypointBinding(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		labels  map[string]string
		nsLabel map[string]string
		want    WaypointRef
		wantOK  bool
	}{
		{name: "none anywhere", wantOK: false},
		{name: "object label", labels: map[string]string{LabelUseWaypoint: "wp"}, want: WaypointRef{"shop", "wp"}, wantOK: true},
		{name: "namespace label", nsLabel: map[string]string{LabelUseWaypoint: "ns-wp"}, want: WaypointRef{"shop", "ns-wp"}, wantOK: true},
		{name: "object label wins", labels: map[string]string{LabelUseWaypoint: "wp"}, nsLabel: map[string]string{LabelUseWaypoint: "ns-wp"}, want: WaypointRef{"shop", "wp"}, wantOK: true},
		{name: "object none opts out of namespace waypoint", labels: map[string]string{LabelUseWaypoint: "none"}, nsLabel: map[string]string{LabelUseWaypoint: "ns-wp"}, wantOK: false},
		{name: "namespace none", nsLabel: map[string]string{LabelUseWaypoint: "none"}, wantOK: false},
		{name: "object waypoint namespace", labels: map[string]string{LabelUseWaypoint: "wp", LabelUseWaypointNamespace: "infra"}, want: WaypointRef{"infra", "wp"}, wantOK: true},
		{name: "namespace waypoint namespace", nsLabel: map[string]string{LabelUseWaypoint: "wp", LabelUseWaypointNamespace: "infra"}, want: WaypointRef{"infra", "wp"}, wantOK: true},
		{name: "namespace's waypoint namespace does not apply to the object's label",
			labels: map[string]string{LabelUseWaypoint: "wp"}, nsLabel: map[string]string{LabelUseWaypointNamespace: "infra"}, want: WaypointRef{"shop", "wp"}, wantOK: true},
		{name: "empty object label falls back", labels: map[string]string{LabelUseWaypoint: ""}, nsLabel: map[string]string{LabelUseWaypoint: "ns-wp"}, want: WaypointRef{"shop", "ns-wp"}, wantOK: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := WaypointBinding("shop", tt.labels, ReadLabels(tt.nsLabel, nil))
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("WaypointBinding() = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func gateway(mods ...func(*gatewayv1.Gateway)) *gatewayv1.Gateway {
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Namespace: "shop"},
		Spec:       gatewayv1.GatewaySpec{GatewayClassName: WaypointClass},
		Status: gatewayv1.GatewayStatus{Addresses: []gatewayv1.GatewayStatusAddress{
			{Type: ptr.To(gatewayv1.IPAddressType), Value: "10.96.0.99"},
			{Type: ptr.To(gatewayv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"},
		}},
	}
	for _, m := range mods {
		m(gw)
	}
	return gw
}

func TestWaypointAddress(t *testing.T) {
	t.Parallel()
	ipOnly := func(gw *gatewayv1.Gateway) { gw.Status.Addresses = gw.Status.Addresses[:1] }
	for _, tt := range []struct {
		name        string
		gw          *gatewayv1.Gateway
		class       map[string]string
		forWorkload bool
		wantErr     bool
	}{
		{name: "hostname preferred", gw: gateway()},
		{name: "ip when no hostname", gw: gateway(ipOnly)},
		{name: "untyped address is an IP", gw: gateway(func(gw *gatewayv1.Gateway) {
			gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Value: "10.96.0.98"}}
		})},
		{name: "service waypoint refuses workload traffic", gw: gateway(), forWorkload: true, wantErr: true},
		{name: "workload waypoint", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Labels = map[string]string{LabelWaypointFor: "workload"} }), forWorkload: true},
		{name: "workload waypoint refuses service traffic", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Labels = map[string]string{LabelWaypointFor: "workload"} }), wantErr: true},
		{name: "all serves workloads", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Labels = map[string]string{LabelWaypointFor: "all"} }), forWorkload: true},
		{name: "class label applies", gw: gateway(), class: map[string]string{LabelWaypointFor: "all"}, forWorkload: true},
		{name: "gateway label overrides class", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Labels = map[string]string{LabelWaypointFor: "none"} }),
			class: map[string]string{LabelWaypointFor: "all"}, wantErr: true},
		{name: "wrong class", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Spec.GatewayClassName = "istio" }), wantErr: true},
		{name: "no address yet", gw: gateway(func(gw *gatewayv1.Gateway) { gw.Status.Addresses = nil }), wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := WaypointAddress(tt.gw, tt.class, tt.forWorkload, Config{})
			if tt.wantErr {
				if !errors.Is(err, ErrNotAWaypoint) {
					t.Fatalf("WaypointAddress() = %v, %v; want ErrNotAWaypoint", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, "waypoint/"+golden(tt.name), got)
		})
	}
}
