package debug

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
