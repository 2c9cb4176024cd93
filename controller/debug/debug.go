// Package debug serves the controller's monitoring port: liveness,
// readiness and the current tables as JSON (/debug/tables), until the xDS
// server brings its own views.
package debug

import (
	"encoding/json"
	"net/http"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Tables is what the debug views read; *index.Index implements it. It
// must be safe for concurrent use.
type Tables interface {
	AddressNames() []string
	Address(name string) *workloadapi.Address
	AuthorizationNames() []string
	Authorization(name string) *security.Authorization
	Problems() map[string]string
}

// Handler serves /healthz, /readyz (ready once ready returns true) and
// /debug/tables.
func Handler(t Tables, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /debug/tables", func(w http.ResponseWriter, _ *http.Request) {
		out := tablesJSON{Problems: t.Problems()}
		for _, n := range t.AddressNames() {
			if a := t.Address(n); a != nil {
				out.Addresses = append(out.Addresses, entry{Name: n, Resource: raw(a)})
			}
		}
		for _, n := range t.AuthorizationNames() {
			if a := t.Authorization(n); a != nil {
				out.Authorizations = append(out.Authorizations, entry{Name: n, Resource: raw(a)})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	})
	return mux
}

type tablesJSON struct {
	Addresses      []entry           `json:"addresses"`
	Authorizations []entry           `json:"authorizations"`
	Problems       map[string]string `json:"problems,omitempty"`
}

type entry struct {
	Name     string          `json:"name"`
	Resource json.RawMessage `json:"resource"`
}

func raw(m proto.Message) json.RawMessage {
	b, err := protojson.Marshal(m)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}
