// Package status reports what the tables could not represent (an
// unsupported policy, a missing waypoint) as Kubernetes Events on the
// objects concerned, so that nothing is lost silently: kubectl describe
// shows it.
//
// Every controller replica computes the same problems; canopy-controller
// reports them from the replica holding its writers' Lease, a new
// Reporter per term, and the API server's event aggregation folds a new
// leader's repeats.
package status

import (
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

// Reasons of the Events this package writes.
const (
	// ReasonNotApplied: the tables (what node proxies get) cannot
	// represent the object, or all of it.
	ReasonNotApplied = "NotAppliedByNodeProxies"
	// ReasonInvalid: Istio's rules refuse the object, or part of it, and
	// sidecars do not get what they refuse (the validating webhook was
	// bypassed, or the object predates it).
	ReasonInvalid = "InvalidConfiguration"
)

// apiVersions maps the kinds the index reports on to their API versions.
var apiVersions = map[string]string{
	"Pod":                 "v1",
	"Service":             "v1",
	"AuthorizationPolicy": "security.istio.io/v1",
	"PeerAuthentication":  "security.istio.io/v1",
	"ServiceEntry":        "networking.istio.io/v1",
	"WorkloadEntry":       "networking.istio.io/v1",
	"VirtualService":      "networking.istio.io/v1",
	"DestinationRule":     "networking.istio.io/v1",
	"Sidecar":             "networking.istio.io/v1",
}

// Reporter turns problem sets into Events, one per new or changed problem.
// It is safe for concurrent use.
type Reporter struct {
	recorder record.EventRecorder
	reason   string

	mu       sync.Mutex
	reported map[string]string
}

// NewReporter returns a Reporter writing through recorder, with reason
// ReasonNotApplied.
func NewReporter(recorder record.EventRecorder) *Reporter {
	return NewReporterFor(recorder, ReasonNotApplied)
}

// NewReporterFor returns a Reporter writing Events of reason through
// recorder.
func NewReporterFor(recorder record.EventRecorder, reason string) *Reporter {
	return &Reporter{recorder: recorder, reason: reason, reported: map[string]string{}}
}

// Report takes the current problems, keyed "<Kind> <namespace>/<name>",
// and emits a Warning Event for each one not reported before with the same
// message. Problems that went away are forgotten, so they are reported
// again if they come back.
func (r *Reporter) Report(problems map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, msg := range problems {
		if r.reported[k] == msg {
			continue
		}
		if ref, ok := objectRef(k); ok {
			r.recorder.Event(ref, corev1.EventTypeWarning, r.reason, msg)
		}
		r.reported[k] = msg
	}
	for k := range r.reported {
		if _, ok := problems[k]; !ok {
			delete(r.reported, k)
		}
	}
}

// objectRef parses a problem key into the object it concerns.
func objectRef(k string) (*corev1.ObjectReference, bool) {
	kind, nsName, ok := strings.Cut(k, " ")
	if !ok {
		return nil, false
	}
	ns, name, ok := strings.Cut(nsName, "/")
	apiVersion, known := apiVersions[kind]
	if !ok || !known || name == "" {
		return nil, false
	}
	return &corev1.ObjectReference{APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name}, true
}
