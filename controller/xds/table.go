package xds

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Resource is one xDS resource as every connection sends it: marshalled
// once, shared by all. A Resource is immutable; a change replaces it, so
// a connection that remembers the *Resource it sent knows exactly what the
// proxy holds.
type Resource struct {
	TypeURL string
	Name    string
	// Version is the hex xxhash64 of the marshalled Any (wire contract §1.9).
	Version string
	Body    *anypb.Any
	// Aliases are the on-demand lookup names of an Address.
	Aliases []string

	// node is a workload's node; services the service keys it serves.
	node     string
	services []string
	// wire is the resource as a response carries it (without aliases),
	// one message shared by every response: a whole table is then a
	// slice of pointers, not thousands of new messages per proxy.
	// Responses only read it.
	wire *discoveryv3.Resource
	// wireSize is what the resource adds to a response, encoded.
	wireSize int64
}

// Wire returns the resource as a response carries it; shared, never to be
// changed.
func (r *Resource) Wire() *discoveryv3.Resource {
	if r.wire == nil {
		return &discoveryv3.Resource{Name: r.Name, Version: r.Version, Resource: r.Body}
	}
	return r.wire
}

// NewResource marshals msg (deterministically, so equal content has equal
// versions) into a Resource named name.
func NewResource(typeURL, name string, msg proto.Message) (*Resource, error) {
	r, err := newBareResource(typeURL, name, msg)
	if err != nil {
		return nil, err
	}
	r.wire = &discoveryv3.Resource{Name: name, Version: r.Version, Resource: r.Body}
	entry := proto.Size(r.wire)
	r.wireSize = int64(protowire.SizeTag(2) + protowire.SizeBytes(entry)) // with its field tag and length
	if a, ok := msg.(*workloadapi.Address); ok {
		r.Aliases = workloadapi.Aliases(a)
		if w := a.GetWorkload(); w != nil {
			r.node = w.GetNode()
			r.services = slices.Sorted(maps.Keys(w.GetServices()))
		}
	}
	return r, nil
}

// newBareResource is NewResource without what sharing a resource between
// responses takes (its wire message and size): for a resource built for
// one response only.
func newBareResource(typeURL, name string, msg proto.Message) (*Resource, error) {
	value, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("marshal %s %q: %w", typeURL, name, err)
	}
	body := &anypb.Any{TypeUrl: typeURL, Value: value}
	whole, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("marshal %s %q: %w", typeURL, name, err)
	}
	return &Resource{TypeURL: typeURL, Name: name, Version: strconv.FormatUint(xxhash.Sum64(whole), 16), Body: body}, nil
}

// Table holds the current resources of every type, with the lookups that
// on-demand subscriptions need. One goroutine writes (the push pipeline);
// connections read.
type Table struct {
	mu     sync.RWMutex
	byType map[string]map[string]*Resource
	// wireSize is, per type, the encoded size of all its resources: what
	// a response with the whole table weighs.
	wireSize map[string]int64
	// frozen is, per type, a copy of its resources made since its last
	// change (Frozen), shared by the connections that compare against it.
	frozen map[string]map[string]*Resource
	// byAlias, byNode and byService map to Address names.
	byAlias   map[string]map[string]struct{}
	byNode    map[string]map[string]struct{}
	byService map[string]map[string]struct{}
}

// NewTable returns an empty Table.
func NewTable() *Table {
	return &Table{
		byType:    map[string]map[string]*Resource{},
		wireSize:  map[string]int64{},
		frozen:    map[string]map[string]*Resource{},
		byAlias:   map[string]map[string]struct{}{},
		byNode:    map[string]map[string]struct{}{},
		byService: map[string]map[string]struct{}{},
	}
}

// Put stores r (nil removes name) and reports whether the table changed:
// a resource with the same version is kept, so its *Resource stays the same.
func (t *Table) Put(typeURL, name string, r *Resource) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	resources := t.byType[typeURL]
	if resources == nil {
		resources = map[string]*Resource{}
		t.byType[typeURL] = resources
	}
	old := resources[name]
	if r == nil {
		if old == nil {
			return false
		}
		delete(t.frozen, typeURL)
		t.unlink(old)
		delete(resources, name)
		t.wireSize[typeURL] -= old.wireSize
		return true
	}
	if old != nil && old.Version == r.Version {
		return false
	}
	delete(t.frozen, typeURL)
	if old != nil {
		t.unlink(old)
		t.wireSize[typeURL] -= old.wireSize
	}
	resources[name] = r
	t.link(r)
	t.wireSize[typeURL] += r.wireSize
	return true
}

// Frozen returns the resources of a type as they are now, in a map that
// never changes: one copy per change of the type, however many callers
// ask. It is not to be written.
func (t *Table) Frozen(typeURL string) map[string]*Resource {
	t.mu.RLock()
	f, ok := t.frozen[typeURL]
	t.mu.RUnlock()
	if ok {
		return f
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.frozen[typeURL]; ok {
		return f
	}
	f = maps.Clone(t.byType[typeURL])
	if f == nil {
		f = map[string]*Resource{}
	}
	t.frozen[typeURL] = f
	return f
}

// WireSize returns the encoded size of every resource of a type: about
// what a response carrying the whole table weighs.
func (t *Table) WireSize(typeURL string) int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.wireSize[typeURL]
}

func (t *Table) link(r *Resource) {
	for _, a := range r.Aliases {
		addTo(t.byAlias, a, r.Name)
	}
	if r.node != "" {
		addTo(t.byNode, r.node, r.Name)
	}
	for _, s := range r.services {
		addTo(t.byService, s, r.Name)
	}
}

func (t *Table) unlink(r *Resource) {
	for _, a := range r.Aliases {
		removeFrom(t.byAlias, a, r.Name)
	}
	if r.node != "" {
		removeFrom(t.byNode, r.node, r.Name)
	}
	for _, s := range r.services {
		removeFrom(t.byService, s, r.Name)
	}
}

func addTo(m map[string]map[string]struct{}, k, name string) {
	set := m[k]
	if set == nil {
		set = map[string]struct{}{}
		m[k] = set
	}
	set[name] = struct{}{}
}

func removeFrom(m map[string]map[string]struct{}, k, name string) {
	delete(m[k], name)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// Get returns the current resource, or nil.
func (t *Table) Get(typeURL, name string) *Resource {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.byType[typeURL][name]
}

// Names returns every resource name of a type, in no order.
func (t *Table) Names(typeURL string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Collect(maps.Keys(t.byType[typeURL]))
}

// Len returns the number of resources of a type.
func (t *Table) Len(typeURL string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.byType[typeURL])
}

// Resolve returns the names an on-demand key stands for (wire contract §2.4):
// the key itself when it is a resource's name, and the resources it is an
// alias of. Only Addresses have aliases.
func (t *Table) Resolve(typeURL, key string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []string
	if _, ok := t.byType[typeURL][key]; ok {
		out = append(out, key)
	}
	if typeURL == workloadapi.AddressTypeURL {
		for name := range t.byAlias[key] {
			if name != key {
				out = append(out, name)
			}
		}
	}
	return out
}

// NodeWorkloads returns the names of the workloads on a node.
func (t *Table) NodeWorkloads(node string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Collect(maps.Keys(t.byNode[node]))
}

// ServiceWorkloads returns the names of the workloads serving a service key.
func (t *Table) ServiceWorkloads(service string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Collect(maps.Keys(t.byService[service]))
}
