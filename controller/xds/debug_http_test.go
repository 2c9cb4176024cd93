package xds

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// TestConfigDumpGolden: what a proxy was sent, as a person reads it:
// addresses are text ("10.244.1.5"), not protojson's base64 of the bytes.
func TestConfigDumpGolden(t *testing.T) {
	t.Parallel()
	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	addresses, authorizations := newWatch(workloadapi.AddressTypeURL), newWatch(workloadapi.AuthorizationTypeURL)
	w, err := NewResource(workloadapi.AddressTypeURL, "Kubernetes//Pod/demo/echo-a", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/demo/echo-a", Name: "echo-a", Namespace: "demo", Node: "node-1",
		Addresses: [][]byte{ip("10.244.1.5"), ip("fd00:10:244:1::5")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewResource(workloadapi.AddressTypeURL, "demo/echo.demo.svc.cluster.local", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Network: "net1", Address: ip("10.96.0.20")}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewResource(workloadapi.AuthorizationTypeURL, "demo/deny-subnet", &security.Authorization{Name: "deny-subnet", Namespace: "demo", Action: security.Action_DENY,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{
			SourceIps: []*security.Address{{Address: ip("10.244.2.0"), Length: 24}},
		}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	addresses.sent.set(w.Name, w)
	addresses.sent.set(s.Name, s)
	addresses.sent.set("demo/removed", heldVersion("demo/removed", "stale"))
	authorizations.sent.set(p.Name, p)
	c := &conn{id: "1", proxy: Proxy{ProxyID: "ztunnel-a.istio-system"},
		watches: map[string]*watch{workloadapi.AddressTypeURL: addresses, workloadapi.AuthorizationTypeURL: authorizations}}

	srv := &Server{conns: map[*conn]struct{}{c: {}}}
	rec := httptest.NewRecorder()
	srv.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/config_dump?proxyID=ztunnel-a.istio-system", nil))
	if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("GET /debug/config_dump: %d, valid JSON %v\n%s", rec.Code, json.Valid(rec.Body.Bytes()), rec.Body)
	}
	golden.Check(t, "config-dump.golden", rec.Body.Bytes())
}
