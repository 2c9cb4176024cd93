package debug

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

type fakeTables struct{}

func (fakeTables) AddressNames() []string { return []string{"Kubernetes//Pod/a/b"} }
func (fakeTables) Address(string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{Uid: "Kubernetes//Pod/a/b"}}}
}
func (fakeTables) AuthorizationNames() []string { return []string{"a/p"} }
func (fakeTables) Authorization(string) *security.Authorization {
	return &security.Authorization{Name: "p", Namespace: "a"}
}
func (fakeTables) Problems() map[string]string {
	return map[string]string{"AuthorizationPolicy a/x": "CUSTOM"}
}

func TestHandler(t *testing.T) {
	ready := false
	health, tables := Health(func() bool { return ready }), TablesHandler(fakeTables{})
	get := func(path string) *httptest.ResponseRecorder {
		h := health
		if strings.HasPrefix(path, "/debug/") {
			h = tables
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	if c := get("/healthz").Code; c != 200 {
		t.Errorf("healthz = %d", c)
	}
	if c := get("/readyz").Code; c != 503 {
		t.Errorf("readyz before sync = %d, want 503", c)
	}
	ready = true
	if c := get("/readyz").Code; c != 200 {
		t.Errorf("readyz after sync = %d", c)
	}
	var got struct {
		Addresses []struct {
			Name     string `json:"name"`
			Resource struct {
				Workload struct {
					UID string `json:"uid"`
				} `json:"workload"`
			} `json:"resource"`
		} `json:"addresses"`
		Authorizations []struct{ Name string } `json:"authorizations"`
		Problems       map[string]string       `json:"problems"`
	}
	rec := get("/debug/tables")
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("tables JSON: %v\n%s", err, rec.Body)
	}
	if len(got.Addresses) != 1 || got.Addresses[0].Resource.Workload.UID != "Kubernetes//Pod/a/b" ||
		len(got.Authorizations) != 1 || got.Problems["AuthorizationPolicy a/x"] != "CUSTOM" {
		t.Errorf("tables = %+v", got)
	}
}

// meshTables holds a workload, a service and a policy with IP addresses.
type meshTables struct{}

func (meshTables) AddressNames() []string {
	return []string{"Kubernetes//Pod/demo/echo-a", "demo/echo.demo.svc.cluster.local"}
}

func (meshTables) Address(name string) *workloadapi.Address {
	if name == "demo/echo.demo.svc.cluster.local" {
		return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: ip("10.96.0.20")}, {Address: ip("fd00:10:96::20")}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}}
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: name, Name: "echo-a", Namespace: "demo", Node: "node-1", ServiceAccount: "echo",
		Addresses:      [][]byte{ip("10.244.1.5"), ip("fd00:10:244:1::5")},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{
			Address: &workloadapi.NetworkAddress{Address: ip("10.96.0.30")}}, HboneMtlsPort: 15008},
	}}}
}

func (meshTables) AuthorizationNames() []string { return []string{"demo/deny-subnet"} }
func (meshTables) Authorization(string) *security.Authorization {
	return &security.Authorization{Name: "deny-subnet", Namespace: "demo", Scope: security.Scope_NAMESPACE, Action: security.Action_DENY,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{
			SourceIps: []*security.Address{{Address: ip("10.244.2.0"), Length: 24}},
		}}}}}}}
}
func (meshTables) Problems() map[string]string { return nil }

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

// TestTablesGolden: /debug/tables is JSON a person reads, so addresses are
// text ("10.244.1.5"), not protojson's base64 of the bytes.
func TestTablesGolden(t *testing.T) {
	rec := httptest.NewRecorder()
	TablesHandler(meshTables{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/tables", nil))
	if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("GET /debug/tables: %d, valid JSON %v\n%s", rec.Code, json.Valid(rec.Body.Bytes()), rec.Body)
	}
	golden.Check(t, "tables.golden", rec.Body.Bytes())
}
