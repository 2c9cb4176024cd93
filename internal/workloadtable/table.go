// Package workloadtable is a client's copy of the workload xDS tables:
// workloads, services and authorization policies as the control plane sent
// them, indexed the way a node proxy looks them up
// (docs/wire-contract.md §10.3): workloads by UID, by "<network>/<ip>" and by
// node; services by "<namespace>/<hostname>" and by VIP; policies by
// "<namespace>/<name>".
//
// It applies Delta xDS responses with ztunnel's semantics
// (docs/wire-contract.md §2.3): a workload replaces any earlier one with its
// UID; a removed name is a workload UID, else a service key. A Table is safe
// for concurrent use and its getters return shared protos that callers must
// not modify.
//
// Unlike ztunnel, whose VIP index keeps the last service written, a VIP
// stays with the service that holds it (vip.go): a later service that
// claims it too is kept but rejected, and takes the VIP over when the
// holder goes. An address is looked up as a workload first, then as a
// VIP, as ztunnel does, and a service whose visibility is NAMESPACE is
// found only by clients of its namespace.
package workloadtable

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Rejection is one resource a response could not apply.
type Rejection struct {
	Name string
	Err  error
}

func (r Rejection) Error() string { return r.Name + ": " + r.Err.Error() }

// Table is the local copy.
type Table struct {
	mu        sync.RWMutex
	workloads map[string]*workloadapi.Workload
	services  map[string]*workloadapi.Service
	policies  map[string]*security.Authorization
	// byAddress maps a workload's "<network>/<ip>" to its UID; byVIP
	// maps a service VIP key ("<network>/<ip>" or a CIDR key) to the keys
	// of the services claiming it, in the order they claimed it; byNode
	// maps a node to workload UIDs.
	byAddress map[string]string
	byVIP     map[string][]string
	byNode    map[string]map[string]struct{}
	// byService maps a service key to the UIDs of its workloads.
	byService map[string]map[string]struct{}
	// byHostname maps a lower-cased hostname to the keys of the services
	// with it (one per namespace at most: the key is
	// "<namespace>/<hostname>").
	byHostname map[string]map[string]struct{}
	// changed is closed, and replaced, by every Apply that held
	// something to apply.
	changed chan struct{}
}

// New returns an empty Table.
func New() *Table {
	return &Table{
		workloads:  map[string]*workloadapi.Workload{},
		services:   map[string]*workloadapi.Service{},
		policies:   map[string]*security.Authorization{},
		byAddress:  map[string]string{},
		byVIP:      map[string][]string{},
		byNode:     map[string]map[string]struct{}{},
		byService:  map[string]map[string]struct{}{},
		byHostname: map[string]map[string]struct{}{},
		changed:    make(chan struct{}),
	}
}

// Changed returns a channel closed by the next Apply that changes
// anything: a watcher takes it, waits, and takes it again.
func (t *Table) Changed() <-chan struct{} {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.changed
}

// notify wakes the watchers; callers hold t.mu.
func (t *Table) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// Apply applies one response of typeURL. Resources that do not decode, or
// whose name does not match their content, are rejected and the rest
// applied, as ztunnel does; the client NACKs with the rejections. A
// service that claims a VIP another service still holds once the whole
// response is applied is kept, without that VIP, and rejected too.
func (t *Table) Apply(typeURL string, resources []*discoveryv3.Resource, removed []string) []Rejection {
	var rejected []Rejection
	switch typeURL {
	case workloadapi.AddressTypeURL:
		decoded := make([]*workloadapi.Address, 0, len(resources))
		for _, r := range resources {
			a, err := decodeAddress(r)
			if err != nil {
				rejected = append(rejected, Rejection{Name: r.GetName(), Err: err})
				continue
			}
			decoded = append(decoded, a)
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, a := range decoded {
			t.putAddress(a)
		}
		for _, name := range removed {
			t.removeAddress(name)
		}
		// VIPs are checked once the whole response is in: a control plane
		// hands a VIP over by removing (or updating) its holder in the
		// same response that gives it to the next service.
		for _, a := range decoded {
			if a.GetService() != nil {
				if err := t.checkVIPs(workloadapi.ResourceName(a)); err != nil {
					rejected = append(rejected, Rejection{Name: workloadapi.ResourceName(a), Err: err})
				}
			}
		}
		if len(decoded)+len(removed) > 0 {
			t.notify()
		}
	case workloadapi.AuthorizationTypeURL:
		decoded := make([]*security.Authorization, 0, len(resources))
		for _, r := range resources {
			p := &security.Authorization{}
			if err := decode(r, workloadapi.AuthorizationTypeURL, p); err != nil {
				rejected = append(rejected, Rejection{Name: r.GetName(), Err: err})
				continue
			}
			if n := security.ResourceName(p); n != r.GetName() {
				rejected = append(rejected, Rejection{Name: r.GetName(), Err: fmt.Errorf("policy is named %q", n)})
				continue
			}
			decoded = append(decoded, p)
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, p := range decoded {
			t.policies[security.ResourceName(p)] = p
		}
		for _, name := range removed {
			delete(t.policies, name)
		}
		if len(decoded)+len(removed) > 0 {
			t.notify()
		}
	default:
		for _, r := range resources {
			rejected = append(rejected, Rejection{Name: r.GetName(), Err: fmt.Errorf("unknown type %q", typeURL)})
		}
	}
	return rejected
}

func decode(r *discoveryv3.Resource, typeURL string, m proto.Message) error {
	body := r.GetResource()
	if body == nil {
		return errors.New("no resource body")
	}
	if body.GetTypeUrl() != typeURL {
		return fmt.Errorf("resource of type %q, want %q", body.GetTypeUrl(), typeURL)
	}
	if err := proto.Unmarshal(body.GetValue(), m); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

func decodeAddress(r *discoveryv3.Resource) (*workloadapi.Address, error) {
	a := &workloadapi.Address{}
	if err := decode(r, workloadapi.AddressTypeURL, a); err != nil {
		return nil, err
	}
	switch {
	case a.GetWorkload() != nil:
		if a.GetWorkload().GetUid() == "" {
			return nil, errors.New("workload without a uid")
		}
	case a.GetService() != nil:
		if _, _, err := workloadapi.ParseServiceKey(workloadapi.ResourceName(a)); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("address is neither a workload nor a service")
	}
	if n := workloadapi.ResourceName(a); n != r.GetName() {
		return nil, fmt.Errorf("address is named %q", n)
	}
	return a, nil
}

func (t *Table) putAddress(a *workloadapi.Address) {
	name := workloadapi.ResourceName(a)
	if w := a.GetWorkload(); w != nil {
		t.removeWorkload(name)
		t.workloads[name] = w
		// Host-network workloads share the node's IP: not indexed by it
		// (wire contract §10.3).
		if w.GetNetworkMode() != workloadapi.NetworkMode_HOST_NETWORK {
			for _, alias := range workloadapi.Aliases(a) {
				t.byAddress[alias] = name
			}
		}
		if n := w.GetNode(); n != "" {
			if t.byNode[n] == nil {
				t.byNode[n] = map[string]struct{}{}
			}
			t.byNode[n][name] = struct{}{}
		}
		for svc := range w.GetServices() {
			if t.byService[svc] == nil {
				t.byService[svc] = map[string]struct{}{}
			}
			t.byService[svc][name] = struct{}{}
		}
		return
	}
	t.putService(name, a.GetService())
}

func (t *Table) removeAddress(name string) {
	if _, ok := t.workloads[name]; ok {
		t.removeWorkload(name)
		return
	}
	if _, _, err := workloadapi.ParseServiceKey(name); err == nil {
		t.removeService(name)
	}
}

func (t *Table) removeWorkload(uid string) {
	old := t.workloads[uid]
	if old == nil {
		return
	}
	delete(t.workloads, uid)
	for _, alias := range workloadapi.Aliases(&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: old}}) {
		if t.byAddress[alias] == uid {
			delete(t.byAddress, alias)
		}
	}
	if n := old.GetNode(); n != "" {
		delete(t.byNode[n], uid)
		if len(t.byNode[n]) == 0 {
			delete(t.byNode, n)
		}
	}
	for svc := range old.GetServices() {
		delete(t.byService[svc], uid)
		if len(t.byService[svc]) == 0 {
			delete(t.byService, svc)
		}
	}
}

func (t *Table) removeService(key string) {
	old := t.services[key]
	if old == nil {
		return
	}
	delete(t.services, key)
	for _, vip := range vipKeys(old) {
		t.unclaim(vip, key)
	}
	t.unindexHostname(old.GetHostname(), key)
}

// unindexHostname drops key from the services with host.
func (t *Table) unindexHostname(host, key string) {
	h := strings.ToLower(host)
	delete(t.byHostname[h], key)
	if len(t.byHostname[h]) == 0 {
		delete(t.byHostname, h)
	}
}

// Workload returns a workload by UID.
func (t *Table) Workload(uid string) *workloadapi.Workload {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.workloads[uid]
}

// Service returns a service by "<namespace>/<hostname>".
func (t *Table) Service(key string) *workloadapi.Service {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.services[key]
}

// ByHostname returns the services with hostname host (compared without
// regard to case, as DNS names are), sorted by key: the same hostname
// may be a service in several namespaces (a ServiceEntry host, say).
func (t *Table) ByHostname(host string) []*workloadapi.Service {
	t.mu.RLock()
	defer t.mu.RUnlock()
	keys := t.byHostname[strings.ToLower(host)]
	if len(keys) == 0 {
		return nil
	}
	out := make([]*workloadapi.Service, 0, len(keys))
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		out = append(out, t.services[k])
	}
	return out
}

// Policy returns an authorization policy by "<namespace>/<name>".
func (t *Table) Policy(name string) *security.Authorization {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.policies[name]
}

// ByAddress returns the workload or service at a network address as a
// client of no particular namespace sees it: a workload, else the service
// holding the VIP if its visibility is PUBLIC. Exactly one is non-nil when
// found.
func (t *Table) ByAddress(network string, ip netip.Addr) (*workloadapi.Workload, *workloadapi.Service) {
	return t.ByAddressFrom("", network, ip)
}

// ByAddressFrom returns the workload or service at a network address as a
// client in namespace ns sees it: a workload, else the service holding
// the VIP that ns may see. Exactly one is non-nil when found.
func (t *Table) ByAddressFrom(ns, network string, ip netip.Addr) (*workloadapi.Workload, *workloadapi.Service) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	key := workloadapi.IPKey(network, ip)
	if uid, ok := t.byAddress[key]; ok {
		return t.workloads[uid], nil
	}
	if svc := t.vipService(key, ns); svc != nil {
		return nil, svc
	}
	return nil, nil
}

// NodeWorkloads returns the workloads on a node, sorted by UID.
func (t *Table) NodeWorkloads(node string) []*workloadapi.Workload {
	t.mu.RLock()
	defer t.mu.RUnlock()
	uids := slices.Sorted(maps.Keys(t.byNode[node]))
	out := make([]*workloadapi.Workload, len(uids))
	for i, u := range uids {
		out[i] = t.workloads[u]
	}
	return out
}

// ServiceWorkloads returns the workloads serving a service key, sorted by
// UID.
func (t *Table) ServiceWorkloads(key string) []*workloadapi.Workload {
	t.mu.RLock()
	defer t.mu.RUnlock()
	uids := slices.Sorted(maps.Keys(t.byService[key]))
	out := make([]*workloadapi.Workload, len(uids))
	for i, u := range uids {
		out[i] = t.workloads[u]
	}
	return out
}

// Policies returns every authorization policy held.
func (t *Table) Policies() []*security.Authorization {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Collect(maps.Values(t.policies))
}

// Has reports whether key names something held: a workload UID, a service
// key, a policy key or a "<network>/<ip>" alias. On-demand lookups
// complete on it.
func (t *Table) Has(key string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if _, ok := t.workloads[key]; ok {
		return true
	}
	if _, ok := t.services[key]; ok {
		return true
	}
	if _, ok := t.byAddress[key]; ok {
		return true
	}
	if _, ok := t.byVIP[key]; ok {
		return true
	}
	_, ok := t.policies[key]
	return ok
}

// Snapshot is a sorted copy of the whole table.
type Snapshot struct {
	Workloads []*workloadapi.Workload
	Services  []*workloadapi.Service
	Policies  []*security.Authorization
}

// Snapshot returns everything held, sorted by name.
func (t *Table) Snapshot() Snapshot {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var s Snapshot
	for _, k := range slices.Sorted(maps.Keys(t.workloads)) {
		s.Workloads = append(s.Workloads, t.workloads[k])
	}
	for _, k := range slices.Sorted(maps.Keys(t.services)) {
		s.Services = append(s.Services, t.services[k])
	}
	for _, k := range slices.Sorted(maps.Keys(t.policies)) {
		s.Policies = append(s.Policies, t.policies[k])
	}
	return s
}

// JoinRejections formats rejections as a NACK's error_detail message, the
// individual errors joined by "; " as ztunnel does.
func JoinRejections(rs []Rejection) string {
	msgs := make([]string, len(rs))
	for i, r := range rs {
		msgs[i] = r.Error()
	}
	return strings.Join(msgs, "; ")
}
