package admin

import (
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func res(t *testing.T, typeURL, name string, m proto.Message) *discoveryv3.Resource {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.Resource{Name: name, Resource: &anypb.Any{TypeUrl: typeURL, Value: b}}
}

// TestConfigDumpShape checks the keys istioctl ztunnel-config reads.
func TestConfigDumpShape(t *testing.T) {
	tbl := workloadtable.New()
	w := &workloadapi.Workload{Uid: "u1", Name: "web-1", Namespace: "apps", Addresses: [][]byte{netip.MustParseAddr("10.244.1.5").AsSlice()},
		Node: "node-1", TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY,
		Services: map[string]*workloadapi.PortList{"apps/web.apps.svc.cluster.local": {}}}
	svc := &workloadapi.Service{Name: "web", Namespace: "apps", Hostname: "web.apps.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.10").AsSlice()}}, Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
	pol := &security.Authorization{Name: "strict", Namespace: "istio-system", Scope: security.Scope_GLOBAL, Action: security.Action_DENY,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{NotPrincipals: []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}}}}}}}}}
	tbl.Apply(workloadapi.AddressTypeURL, []*discoveryv3.Resource{
		res(t, workloadapi.AddressTypeURL, "u1", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}),
		res(t, workloadapi.AddressTypeURL, "apps/web.apps.svc.cluster.local", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}}),
	}, nil)
	tbl.Apply(workloadapi.AuthorizationTypeURL, []*discoveryv3.Resource{res(t, workloadapi.AuthorizationTypeURL, "istio-system/strict", pol)}, nil)

	rec := httptest.NewRecorder()
	Handler(Sources{Table: tbl, Version: "test"}).ServeHTTP(rec, httptest.NewRequest("GET", "/config_dump", nil))
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"workloads": []any{map[string]any{"uid": "u1", "workloadIps": []any{"10.244.1.5"}, "protocol": "HBONE", "networkMode": "Standard", "name": "web-1", "namespace": "apps",
			"serviceAccount": "default", "trustDomain": "cluster.local", "workloadType": "deployment", "node": "node-1",
			"services": []any{"apps/web.apps.svc.cluster.local"}, "status": "Healthy", "clusterId": "Kubernetes", "capacity": float64(1)}},
		"services": []any{map[string]any{"name": "web", "namespace": "apps", "hostname": "web.apps.svc.cluster.local", "vips": []any{"/10.96.0.10"},
			"ports": map[string]any{"80": float64(8080)}, "endpoints": map[string]any{"u1": map[string]any{"workloadUid": "u1", "port": map[string]any{}, "status": "Healthy"}},
			"subjectAltNames": []any{}}},
		"policies": []any{map[string]any{"name": "strict", "namespace": "istio-system", "scope": "Global", "action": "Deny", "dryRun": false,
			"rules": []any{[]any{[]any{map[string]any{"notPrincipals": []any{map[string]any{"Presence": []any{}}}}}}}}},
		"certificates": []any{}, "workloadState": map[string]any{}, "version": "test", "config": nil,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config_dump mismatch (-want +got):\n%s", diff)
	}
}
