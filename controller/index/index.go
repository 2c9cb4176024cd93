// Package index keeps the workload discovery tables current: it holds the
// Kubernetes objects the tables depend on, and on every object change
// recomputes only the outputs that change can affect, through the pure
// builders of controller/ambient, and reports what changed by xDS resource
// name.
//
// Published protos are never modified: a recomputed output replaces the
// old one. An Index is safe for concurrent use; updates are serialized.
package index

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Changes lists resource names by what happened to them.
type Changes struct {
	Added, Updated, Removed []string
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Updated)+len(c.Removed) == 0 }

// ChangeSet is what one object change did to the tables.
type ChangeSet struct {
	// Addresses are workload UIDs and "<namespace>/<hostname>" service keys.
	Addresses Changes
	// Authorizations are "<namespace>/<name>" policy keys.
	Authorizations Changes
	// SidecarInputs: what sidecar xDS reads of an object beyond the tables
	// changed (its sidecar part: sidecar_parts.go), such as a
	// VirtualService, a pod's labels or a PeerAuthentication as written.
	SidecarInputs bool
}

// Empty reports whether nothing changed.
func (c ChangeSet) Empty() bool {
	return c.Addresses.Empty() && c.Authorizations.Empty() && !c.SidecarInputs
}

type key struct{ namespace, name string }

func (k key) String() string { return k.namespace + "/" + k.name }

// Index holds the inputs and the published tables.
type Index struct {
	cfg ambient.Config
	// network is cfg.Network as configured; cfg.Network follows the system
	// namespace's topology.istio.io/network label when it has one.
	network string

	mu         sync.RWMutex
	namespaces map[string]*corev1.Namespace
	nodes      map[string]*corev1.Node
	// namespaceReads and nodeReads are the keys of their labels and
	// annotations that the builders have read (reads.go).
	namespaceReads  map[string]*keysRead
	nodeReads       map[string]*keysRead
	pods            map[key]*corev1.Pod
	services        map[key]*corev1.Service
	policies        map[key]*securityv1.AuthorizationPolicy
	peerAuths       map[key]*securityv1.PeerAuthentication
	gateways        map[key]*gatewayv1.Gateway
	slices          map[key]*discoveryv1.EndpointSlice
	serviceEntries  map[key]*networkingv1.ServiceEntry
	workloadEntries map[key]*networkingv1.WorkloadEntry

	// Secondary indexes keep each update proportional to what it touches.
	podsByNamespace     map[string]map[key]bool
	podsByNode          map[string]map[key]bool
	servicesByNamespace map[string]map[key]bool
	policiesByNamespace map[string]map[key]bool
	// slicesByService and slicePods follow EndpointSlices: the slices of
	// each Service, and the Services whose slices point at each pod (how
	// a selector-less Service gets its pods).
	slicesByService map[key]map[key]bool
	slicePods       map[key]map[key]bool // pod -> services
	servicePods     map[key]map[key]bool // service -> pods
	// sliceWorkloads are the workload UIDs each slice's pod-less
	// endpoints produced.
	sliceWorkloads map[key][]string
	// entriesByNamespace holds ServiceEntries and WorkloadEntries by
	// namespace; entryOutputs the resource names each ServiceEntry
	// produced.
	serviceEntriesByNamespace  map[string]map[key]bool
	workloadEntriesByNamespace map[string]map[key]bool
	entryOutputs               map[key][]string

	addresses map[string]*workloadapi.Address
	// serviceSources are the objects that want to publish each Service
	// name, by owner; serviceWinners the one publishService picked.
	// vipClaims are the names claiming each VIP key, with their winners'
	// claims (owners.go).
	serviceSources map[string]map[string]serviceSource
	serviceWinners map[string]serviceSource
	// hostNames are the names with a winner under each hostname, of which
	// one is canonical.
	hostNames            map[string]map[string]bool
	vipClaims            map[string]map[string]ambient.Claim
	authorizations       map[string]*security.Authorization
	peerAuthsByNamespace map[string]map[key]bool
	// problems records why an object produced nothing, or less;
	// conflicts, by object, the names and addresses it lost to another
	// object, by what was lost.
	problems  map[string]string
	conflicts map[string]map[string]string
	// portProblems caches the unresolved named ports of Services;
	// dirtyPorts lists the Services to check again.
	portProblems map[key]string
	dirtyPorts   map[key]bool

	// sidecar holds what sidecar xDS reads of the objects beyond the
	// tables (sidecar_parts.go).
	sidecar sidecarParts
	// configProblems are what sidecars do not get of an object (Istio's
	// rules refuse it, or part of it), by "<kind> <namespace>/<name>": the
	// sidecar generators' own verdicts (sidecar.VirtualServiceProblem and
	// its kin), so that what is reported is what is left out.
	configProblems map[string]string
}

// New returns an empty Index.
func New(cfg ambient.Config) *Index {
	return &Index{
		cfg:                        cfg.WithDefaults(),
		network:                    cfg.Network,
		namespaces:                 map[string]*corev1.Namespace{},
		nodes:                      map[string]*corev1.Node{},
		namespaceReads:             map[string]*keysRead{},
		nodeReads:                  map[string]*keysRead{},
		pods:                       map[key]*corev1.Pod{},
		services:                   map[key]*corev1.Service{},
		policies:                   map[key]*securityv1.AuthorizationPolicy{},
		peerAuths:                  map[key]*securityv1.PeerAuthentication{},
		gateways:                   map[key]*gatewayv1.Gateway{},
		slices:                     map[key]*discoveryv1.EndpointSlice{},
		slicesByService:            map[key]map[key]bool{},
		slicePods:                  map[key]map[key]bool{},
		servicePods:                map[key]map[key]bool{},
		sliceWorkloads:             map[key][]string{},
		serviceEntries:             map[key]*networkingv1.ServiceEntry{},
		workloadEntries:            map[key]*networkingv1.WorkloadEntry{},
		serviceEntriesByNamespace:  map[string]map[key]bool{},
		workloadEntriesByNamespace: map[string]map[key]bool{},
		entryOutputs:               map[key][]string{},
		podsByNamespace:            map[string]map[key]bool{},
		podsByNode:                 map[string]map[key]bool{},
		servicesByNamespace:        map[string]map[key]bool{},
		policiesByNamespace:        map[string]map[key]bool{},
		addresses:                  map[string]*workloadapi.Address{},
		serviceSources:             map[string]map[string]serviceSource{},
		serviceWinners:             map[string]serviceSource{},
		hostNames:                  map[string]map[string]bool{},
		vipClaims:                  map[string]map[string]ambient.Claim{},
		conflicts:                  map[string]map[string]string{},
		authorizations:             map[string]*security.Authorization{},
		peerAuthsByNamespace:       map[string]map[key]bool{},
		problems:                   map[string]string{},
		portProblems:               map[key]string{},
		dirtyPorts:                 map[key]bool{},
	}
}

// Address returns the published Address of a resource name, or nil.
func (x *Index) Address(name string) *workloadapi.Address {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.addresses[name]
}

// Authorization returns the published Authorization of a key, or nil.
func (x *Index) Authorization(name string) *security.Authorization {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.authorizations[name]
}

// Pod returns the pod the index holds under namespace/name, or nil. The
// pod is the informer's: never modify it.
func (x *Index) Pod(namespace, name string) *corev1.Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.pods[key{namespace, name}]
}

// NamespaceLabels returns a copy of the labels of the namespace the index
// holds under name, and false when it holds none (not created, deleted, or
// not listed yet).
func (x *Index) NamespaceLabels(name string) (map[string]string, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ns, ok := x.namespaces[name]
	if !ok {
		return nil, false
	}
	return maps.Clone(ns.Labels), true
}

// PodsOnNode returns the pods of namespace the index holds that are
// scheduled to node, in no order. The pods are the informer's: never
// modify them.
func (x *Index) PodsOnNode(namespace, node string) []*corev1.Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []*corev1.Pod
	for k := range x.podsByNode[node] {
		if k.namespace == namespace {
			out = append(out, x.pods[k])
		}
	}
	return out
}

// AddressNames returns every published Address name, sorted.
func (x *Index) AddressNames() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return sortedKeys(x.addresses)
}

// AuthorizationNames returns every published Authorization key, sorted.
func (x *Index) AuthorizationNames() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return sortedKeys(x.authorizations)
}

// Problems returns, by object ("<kind> <namespace>/<name>"), why an input
// produced no output or a reduced one; the caller reports them in status
// or events. It also checks the Services whose pods changed since the last
// call for named target ports that none of their pods declares, so its
// cost follows the changes, not the cluster.
func (x *Index) Problems() map[string]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.dirtyPorts {
		msg := ""
		if svc := x.services[k]; svc != nil {
			msg = x.unresolvedPorts(svc)
		}
		if msg == "" {
			delete(x.portProblems, k)
		} else {
			x.portProblems[k] = msg
		}
	}
	clear(x.dirtyPorts)
	out := make(map[string]string, len(x.problems)+len(x.portProblems)+len(x.conflicts))
	for k, v := range x.problems {
		out[k] = v
	}
	for k, msg := range x.conflictProblems() {
		if prev := out[k]; prev != "" {
			msg = prev + "; " + msg
		}
		out[k] = msg
	}
	for k, msg := range x.portProblems {
		name := "Service " + k.String()
		if prev := out[name]; prev != "" {
			msg = prev + "; " + msg
		}
		out[name] = msg
	}
	return out
}

// unresolvedPorts names the Service's named target ports that none of its
// selected pods declares, when it has pods: traffic to those ports has
// nowhere to go.
func (x *Index) unresolvedPorts(svc *corev1.Service) string {
	var named []string
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type == intstr.String && p.TargetPort.StrVal != "" {
			named = append(named, p.TargetPort.StrVal)
		}
	}
	if len(named) == 0 || len(svc.Spec.Selector) == 0 {
		return ""
	}
	found := map[string]bool{}
	pods := 0
	for pk := range x.podsByNamespace[svc.Namespace] {
		pod := x.pods[pk]
		if !selects(svc.Spec.Selector, pod.Labels) {
			continue
		}
		pods++
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				found[cp.Name] = true
			}
		}
	}
	var missing []string
	for _, n := range named {
		if !found[n] {
			missing = append(missing, fmt.Sprintf("%q", n))
		}
	}
	if pods == 0 || len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("target port %s is declared by none of the Service's %d pods", strings.Join(missing, ", "), pods)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// change accumulates a ChangeSet while one update recomputes outputs.
type change struct{ cs ChangeSet }

func (c *change) record(ch *Changes, name string, had, has bool, same bool) {
	switch {
	case !had && has:
		ch.Added = append(ch.Added, name)
	case had && !has:
		ch.Removed = append(ch.Removed, name)
	case had && has && !same:
		ch.Updated = append(ch.Updated, name)
	}
}

// setAddress publishes (or with nil, removes) an Address.
func (x *Index) setAddress(c *change, name string, a *workloadapi.Address) {
	old, had := x.addresses[name]
	same := had && a != nil && proto.Equal(old, a)
	if same {
		return
	}
	if a == nil {
		delete(x.addresses, name)
	} else {
		x.addresses[name] = a
	}
	c.record(&c.cs.Addresses, name, had, a != nil, same)
}

func (x *Index) setAuthorization(c *change, name string, a *security.Authorization) {
	old, had := x.authorizations[name]
	same := had && a != nil && proto.Equal(old, a)
	if same {
		return
	}
	if a == nil {
		delete(x.authorizations, name)
	} else {
		x.authorizations[name] = a
	}
	c.record(&c.cs.Authorizations, name, had, a != nil, same)
}

func add(m map[string]map[key]bool, group string, k key) {
	if m[group] == nil {
		m[group] = map[key]bool{}
	}
	m[group][k] = true
}

func remove(m map[string]map[key]bool, group string, k key) {
	delete(m[group], k)
	if len(m[group]) == 0 {
		delete(m, group)
	}
}

func selects(selector map[string]string, lbls map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromValidatedSet(selector).Matches(labels.Set(lbls))
}
