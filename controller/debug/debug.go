// Package debug serves the controller's health (liveness, readiness, on
// the monitoring port) and its current tables as JSON (/debug/tables, on
// the loopback-only debug port).
package debug

import (
	"encoding/json"
	"net/http"

	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/internal/debugjson"
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

// Health serves /healthz and /readyz (ready once ready returns true; the
// controller's is the xDS server's tables being loaded).
func Health(ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "tables not loaded", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// TablesHandler serves /debug/tables: every address and authorization,
// and the problems found in the input. Resources are protojson with IP
// addresses as text (see debugjson).
func TablesHandler(t Tables) http.Handler {
	mux := http.NewServeMux()
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
	b, err := debugjson.Marshal(m)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}
