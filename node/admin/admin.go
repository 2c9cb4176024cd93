// Package admin serves the node proxy's admin port
// (docs/wire-contract.md §5.1, §8.2): /config_dump (node/configdump), a
// pod's DNS (/debug/dns), readiness, /quitquitquit and pprof.
package admin

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/configdump"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/pods"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Sources are what the admin port shows.
type Sources struct {
	Table *workloadtable.Table
	Certs func() []*identity.Cert
	// Roots are the trusted roots.
	Roots   func() []*x509.Certificate
	Pods    func() []pods.Pod
	Version string
	Config  map[string]any
	// Quit asks the proxy to drain and exit.
	Quit func()
	// DNS is a served pod's DNS ("<namespace>/<name>"); nil when the
	// proxy serves no DNS.
	DNS func(pod string, services []*workloadapi.Service) (configdump.DNSView, bool)
}

// Dump builds /config_dump.
func (s Sources) Dump() configdump.Dump {
	snap := s.Table.Snapshot()
	d := configdump.Dump{Workloads: configdump.Workloads(snap), Services: configdump.Services(snap), Policies: configdump.Policies(snap),
		Certificates: []configdump.CertState{}, WorkloadState: map[string]configdump.PodState{}, Version: s.Version, Config: s.Config}
	if s.Certs != nil {
		for _, c := range s.Certs() {
			st := configdump.CertState{Identity: c.Identity.String(), State: "Available"}
			for _, x := range c.Chain {
				st.CertChain = append(st.CertChain, configdump.Cert(x))
			}
			if c.Root != nil {
				st.RootCerts = append(st.RootCerts, configdump.Cert(c.Root))
			}
			d.Certificates = append(d.Certificates, st)
		}
		slices.SortFunc(d.Certificates, func(a, b configdump.CertState) int { return strings.Compare(a.Identity, b.Identity) })
	}
	if s.Roots != nil {
		for _, r := range s.Roots() {
			d.TrustedRoots = append(d.TrustedRoots, configdump.Cert(r))
		}
	}
	if s.Pods != nil {
		for _, p := range s.Pods() {
			d.WorkloadState[p.UID] = configdump.PodState{State: p.State, Info: map[string]string{
				"name": p.Info.GetName(), "namespace": p.Info.GetNamespace(), "serviceAccount": p.Info.GetServiceAccount()}}
		}
	}
	return d
}

// Handler serves the admin port (localhost only): /config_dump, /version,
// /debug/dns?pod=<namespace>/<name>, POST /quitquitquit, /debug/pprof/.
func Handler(s Sources) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(s.Version + "\n")) })
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Dump())
	})
	mux.HandleFunc("GET /debug/dns", func(w http.ResponseWriter, r *http.Request) {
		pod := r.URL.Query().Get("pod")
		if s.DNS == nil {
			http.Error(w, "this node proxy serves no DNS (--dns-proxy=false)", http.StatusNotFound)
			return
		}
		v, ok := s.DNS(pod, s.Table.Snapshot().Services)
		if !ok {
			http.Error(w, "no pod "+strconv.Quote(pod)+" served here; ?pod=<namespace>/<name>", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
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
