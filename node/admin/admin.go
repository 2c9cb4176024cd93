package admin

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/pods"
)

// Sources are what the admin port shows.
type Sources struct {
	Table   *workloadtable.Table
	Certs   func() []*identity.Cert
	Pods    func() []pods.Pod
	Version string
	Config  map[string]any
	// Quit asks the proxy to drain and exit.
	Quit func()
}

// Dump builds /config_dump.
func (s Sources) Dump() Dump {
	snap := s.Table.Snapshot()
	d := Dump{Workloads: Workloads(snap), Services: Services(snap), Policies: Policies(snap),
		Certificates: []CertState{}, WorkloadState: map[string]PodState{}, Version: s.Version, Config: s.Config}
	if s.Certs != nil {
		for _, c := range s.Certs() {
			st := CertState{Identity: c.Identity.String(), State: "Available"}
			for _, x := range c.Chain {
				st.CertChain = append(st.CertChain, Cert(x))
			}
			if c.Root != nil {
				st.RootCerts = append(st.RootCerts, Cert(c.Root))
			}
			d.Certificates = append(d.Certificates, st)
		}
		slices.SortFunc(d.Certificates, func(a, b CertState) int { return strings.Compare(a.Identity, b.Identity) })
	}
	if s.Pods != nil {
		for _, p := range s.Pods() {
			d.WorkloadState[p.UID] = PodState{State: p.State, Info: map[string]string{
				"name": p.Info.GetName(), "namespace": p.Info.GetNamespace(), "serviceAccount": p.Info.GetServiceAccount()}}
		}
	}
	return d
}

// Handler serves the admin port (localhost only): /config_dump,
// POST /quitquitquit, /debug/pprof/.
func Handler(s Sources) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Dump())
	})
	mux.HandleFunc("POST /quitquitquit", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		if s.Quit != nil {
			go s.Quit()
		}
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Readiness serves GET /healthz/ready: 200 once ready() holds.
func Readiness(ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
