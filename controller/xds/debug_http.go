package xds

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/internal/debugjson"
)

// DumpedResource is one resource a proxy was sent, in config dumps:
// Resource is the Any as protojson writes it, with IP addresses as text
// (see debugjson).
type DumpedResource struct {
	Name     string          `json:"name"`
	Version  string          `json:"version"`
	Resource json.RawMessage `json:"resource"`
}

// ConfigDump is what one connection of a proxy has been sent, by type.
type ConfigDump struct {
	ProxyID    string                      `json:"proxyID"`
	Connection string                      `json:"connection"`
	Types      map[string][]DumpedResource `json:"types"`
}

// ConfigDumps returns what each connection of proxyID has been sent.
func (s *Server) ConfigDumps(proxyID string) []ConfigDump {
	var out []ConfigDump
	for _, c := range s.connections() {
		if c.proxy.ProxyID == proxyID {
			out = append(out, c.dump())
		}
	}
	for _, c := range s.envoyConnections() {
		if c.proxy.ProxyID == proxyID {
			out = append(out, c.dump())
		}
	}
	slices.SortFunc(out, func(a, b ConfigDump) int { return strings.Compare(a.Connection, b.Connection) })
	return out
}

func (c *conn) dump() ConfigDump {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := ConfigDump{ProxyID: c.proxy.ProxyID, Connection: c.id, Types: map[string][]DumpedResource{}}
	for typ, w := range c.watches {
		d.Types[shortType(typ)] = dumpResources(maps.Collect(w.sent.all()))
	}
	return d
}

// dumpResources renders resources sent, by name, sorted by name.
func dumpResources(sent map[string]*Resource) []DumpedResource {
	rs := []DumpedResource{}
	for name, r := range sent {
		dr := DumpedResource{Name: name, Version: r.Version, Resource: json.RawMessage("null")}
		if r.Body != nil {
			if b, err := debugjson.Marshal(r.Body); err == nil {
				dr.Resource = b
			}
		}
		rs = append(rs, dr)
	}
	slices.SortFunc(rs, func(a, b DumpedResource) int { return strings.Compare(a.Name, b.Name) })
	return rs
}

// DebugHandler serves proxy status and config dumps as JSON:
//
//	GET /debug/syncz                   every connected proxy, per-type status
//	GET /debug/config_dump?proxyID=ID  what that proxy has been sent
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/syncz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("GET /debug/config_dump", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("proxyID")
		if id == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "proxyID is required, e.g. ?proxyID=ztunnel-abcde.istio-system"})
			return
		}
		dumps := s.ConfigDumps(id)
		if len(dumps) == 0 {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no connected proxy " + id})
			return
		}
		writeJSON(w, http.StatusOK, dumps)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away
}
