package index

import (
	"slices"
	"sort"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// UpsertServiceEntry records a ServiceEntry: its Services and inline
// endpoints, and the pods and WorkloadEntries its old or new selector
// picks.
func (x *Index) UpsertServiceEntry(se *networkingv1.ServiceEntry) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{se.Namespace, se.Name}
	old := put(x.serviceEntries, x.serviceEntriesByNamespace, k, se)
	x.setConfigProblem("ServiceEntry "+k.String(), sidecar.ServiceEntryProblem(se))
	return x.serviceEntryChanged(k, old, se)
}

// DeleteServiceEntry forgets a ServiceEntry.
func (x *Index) DeleteServiceEntry(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	old := drop(x.serviceEntries, x.serviceEntriesByNamespace, k)
	x.setConfigProblem("ServiceEntry "+k.String(), "")
	return x.serviceEntryChanged(k, old, nil)
}

func (x *Index) serviceEntryChanged(k key, old, cur *networkingv1.ServiceEntry) ChangeSet {
	var c change
	c.cs.SidecarInputs = setObject(&x.sidecar.serviceEntries, k, cur)
	x.recomputeServiceEntry(&c, k)
	for wk := range x.workloadEntriesByNamespace[k.namespace] {
		we := x.workloadEntries[wk]
		if entrySelects(old, entryLabels(we)) || entrySelects(cur, entryLabels(we)) {
			x.recomputeWorkloadEntry(&c, wk)
		}
	}
	// A workloadSelector picks pods too.
	for pk := range x.podsByNamespace[k.namespace] {
		pod := x.pods[pk]
		if entrySelects(old, pod.Labels) || entrySelects(cur, pod.Labels) {
			x.recomputePod(&c, pk)
		}
	}
	return c.cs
}

// UpsertWorkloadEntry records a WorkloadEntry.
func (x *Index) UpsertWorkloadEntry(we *networkingv1.WorkloadEntry) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{we.Namespace, we.Name}
	put(x.workloadEntries, x.workloadEntriesByNamespace, k, we)
	var c change
	c.cs.SidecarInputs = x.sidecar.setWorkloadEntry(k, we)
	x.recomputeWorkloadEntry(&c, k)
	return c.cs
}

// DeleteWorkloadEntry forgets a WorkloadEntry.
func (x *Index) DeleteWorkloadEntry(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	drop(x.workloadEntries, x.workloadEntriesByNamespace, k)
	var c change
	c.cs.SidecarInputs = x.sidecar.setWorkloadEntry(k, nil)
	x.recomputeWorkloadEntry(&c, k)
	return c.cs
}

// entryLabels are the labels a WorkloadEntry is selected by.
func entryLabels(we *networkingv1.WorkloadEntry) map[string]string {
	return ambient.WorkloadEntryLabels(we)
}

func entrySelects(se *networkingv1.ServiceEntry, lbls map[string]string) bool {
	return se != nil && se.Spec.GetWorkloadSelector() != nil && selects(se.Spec.GetWorkloadSelector().GetLabels(), lbls)
}

// recomputeServiceEntry rebuilds a ServiceEntry's Services and inline
// endpoint workloads, removing names it no longer produces.
func (x *Index) recomputeServiceEntry(c *change, k key) {
	var names []string
	claim := ambient.Claim{Kind: ambient.KindServiceEntry, Namespace: k.namespace, Name: k.name}
	owner := claim.Owner()
	delete(x.problems, owner)
	se := x.serviceEntries[k]
	if se != nil {
		in := ambient.ServiceEntryInput{ServiceEntry: se,
			Waypoint: x.waypoint(owner, k.namespace, se.Labels, false)}
		in.NamespaceLabels, in.NamespaceAnnotations = x.namespaceView(k.namespace)
		// Its endpoints are selected by the ServiceEntry's labels.
		in.Policies = x.entryPolicies(k.namespace, se.Labels)
		in.MTLSPolicy = ambient.MTLSPolicyKey(x.peerAuthsFor(k.namespace, se.Labels), x.cfg)
		x.addProblem(owner, ambient.ServiceEntryExport(se, x.cfg).Warning)
		svcs, wls := ambient.BuildServiceEntry(in, x.cfg)
		claim.Created = se.CreationTimestamp.Time
		for _, s := range svcs {
			name := workloadapi.ServiceKey(s.Namespace, s.Hostname)
			names = append(names, name)
			x.publishService(c, name, serviceSource{service: s, claim: claim})
		}
		for _, w := range wls {
			names = append(names, w.Uid)
			x.setAddress(c, w.Uid, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
		}
	}
	for _, old := range x.entryOutputs[k] {
		if slices.Contains(names, old) {
			continue
		}
		if _, isService := x.serviceSources[old][owner]; isService {
			x.publishService(c, old, serviceSource{claim: claim})
		} else {
			x.setAddress(c, old, nil)
		}
	}
	if len(names) == 0 {
		delete(x.entryOutputs, k)
	} else {
		x.entryOutputs[k] = names
	}
}

// recomputeWorkloadEntry rebuilds a WorkloadEntry's workload.
func (x *Index) recomputeWorkloadEntry(c *change, k key) {
	cfg := x.cfg
	uid := workloadapi.WorkloadEntryUID(cfg.ClusterID, k.namespace, k.name)
	we := x.workloadEntries[k]
	if we == nil {
		delete(x.problems, "WorkloadEntry "+k.String())
		x.setAddress(c, uid, nil)
		return
	}
	lbls := entryLabels(we)
	in := ambient.WorkloadEntryInput{WorkloadEntry: we,
		Waypoint: x.waypoint("WorkloadEntry "+k.String(), k.namespace, we.Labels, true)}
	// Kubernetes Services select WorkloadEntries as they select pods.
	for sk := range x.servicesByNamespace[k.namespace] {
		if svc := x.services[sk]; selects(svc.Spec.Selector, lbls) {
			in.Services = append(in.Services, svc)
		}
	}
	sort.Slice(in.Services, func(i, j int) bool { return in.Services[i].Name < in.Services[j].Name })
	for sk := range x.serviceEntriesByNamespace[k.namespace] {
		if se := x.serviceEntries[sk]; entrySelects(se, lbls) {
			in.ServiceEntries = append(in.ServiceEntries, se)
		}
	}
	sort.Slice(in.ServiceEntries, func(i, j int) bool { return in.ServiceEntries[i].Name < in.ServiceEntries[j].Name })
	in.Policies = x.entryPolicies(k.namespace, lbls)
	in.MTLSPolicy = ambient.MTLSPolicyKey(x.peerAuthsFor(k.namespace, lbls), cfg)
	x.setAddress(c, uid, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: ambient.BuildWorkloadEntry(in, cfg)}})
}
