package index

import (
	"time"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// serviceSource is one object that wants to publish a Service under a
// name: a Kubernetes Service, or a ServiceEntry host. Several may want the
// same "<namespace>/<hostname>" (a ServiceEntry host equal to a Service's
// FQDN, two ServiceEntries sharing a host); one wins and the others wait.
type serviceSource struct {
	service *workloadapi.Service
	kube    bool // a Kubernetes Service wins over ServiceEntries
	created time.Time
	owner   string // "<Kind> <namespace>/<name>", the last tie-breaker
}

// wins reports whether a takes precedence over b: a Kubernetes Service,
// then the oldest ServiceEntry, then by owner name.
func (a serviceSource) wins(b serviceSource) bool {
	if a.kube != b.kube {
		return a.kube
	}
	if !a.created.Equal(b.created) {
		return a.created.Before(b.created)
	}
	return a.owner < b.owner
}

// publishService records (or, with a nil Service, withdraws) one source's
// Service under name, and publishes the winning source's, or removes the
// name when no source is left.
func (x *Index) publishService(c *change, name string, src serviceSource) {
	sources := x.serviceSources[name]
	if src.service == nil {
		delete(sources, src.owner)
	} else {
		if sources == nil {
			sources = map[string]serviceSource{}
			x.serviceSources[name] = sources
		}
		sources[src.owner] = src
	}
	if len(sources) == 0 {
		delete(x.serviceSources, name)
		x.setAddress(c, name, nil)
		return
	}
	var best serviceSource
	first := true
	for _, s := range sources {
		if first || s.wins(best) {
			best, first = s, false
		}
	}
	x.setAddress(c, name, &workloadapi.Address{Type: &workloadapi.Address_Service{Service: best.service}})
}
