package index

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// UpsertEndpointSlice records an EndpointSlice: the pods it points at join
// its Service (what makes a selector-less Service's pods its members), and
// its endpoints without a pod become workloads.
func (x *Index) UpsertEndpointSlice(s *discoveryv1.EndpointSlice) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{s.Namespace, s.Name}
	old := x.slices[k]
	x.slices[k] = s
	return x.sliceChanged(k, old, s)
}

// DeleteEndpointSlice forgets an EndpointSlice.
func (x *Index) DeleteEndpointSlice(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	old := x.slices[k]
	delete(x.slices, k)
	return x.sliceChanged(k, old, nil)
}

func sliceService(s *discoveryv1.EndpointSlice) (key, bool) {
	if s == nil {
		return key{}, false
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	return key{s.Namespace, name}, name != ""
}

// slicePodKeys lists the pods a slice's endpoints point at.
func slicePodKeys(s *discoveryv1.EndpointSlice) []key {
	if s == nil {
		return nil
	}
	var out []key
	for _, ep := range s.Endpoints {
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
			ns := ep.TargetRef.Namespace
			if ns == "" {
				ns = s.Namespace
			}
			out = append(out, key{ns, ep.TargetRef.Name})
		}
	}
	return out
}

// slicesPointAt reports whether an endpoint of the Service's slices points
// at the pod: a targetRef of its name that carries its uid, or no uid at
// all. A targetRef with another uid names an earlier pod of that name, and
// does not make the pod a member.
func (x *Index) slicesPointAt(svc key, pod *corev1.Pod) bool {
	for sk := range x.slicesByService[svc] {
		s := x.slices[sk]
		for _, ep := range s.Endpoints {
			ref := ep.TargetRef
			if ref == nil || ref.Kind != "Pod" || ref.Name != pod.Name || (ref.Namespace != "" && ref.Namespace != pod.Namespace) {
				continue
			}
			if ref.UID == "" || ref.UID == pod.UID {
				return true
			}
		}
	}
	return false
}

func (x *Index) sliceChanged(k key, old, cur *discoveryv1.EndpointSlice) ChangeSet {
	var c change
	oldSvc, hadSvc := sliceService(old)
	newSvc, hasSvc := sliceService(cur)
	if hadSvc {
		delete(x.slicesByService[oldSvc], k)
	}
	if hasSvc {
		if x.slicesByService[newSvc] == nil {
			x.slicesByService[newSvc] = map[key]bool{}
		}
		x.slicesByService[newSvc][k] = true
	}
	// Pods that entered or left: rebuild the service links from every
	// slice of the service, then recompute those pods.
	affected := map[key]bool{}
	for _, pk := range slicePodKeys(old) {
		affected[pk] = true
	}
	for _, pk := range slicePodKeys(cur) {
		affected[pk] = true
	}
	for _, svc := range []key{oldSvc, newSvc} {
		if svc.name != "" {
			x.relinkServicePods(svc)
		}
	}
	for pk := range affected {
		x.recomputePod(&c, pk)
	}
	x.recomputeSliceWorkloads(&c, k)
	return c.cs
}

// relinkServicePods rebuilds which pods the slices of a Service point at.
// It costs the Service's endpoints, not the cluster's.
func (x *Index) relinkServicePods(svc key) {
	for pk := range x.servicePods[svc] {
		delete(x.slicePods[pk], svc)
		if len(x.slicePods[pk]) == 0 {
			delete(x.slicePods, pk)
		}
	}
	delete(x.servicePods, svc)
	for sk := range x.slicesByService[svc] {
		for _, pk := range slicePodKeys(x.slices[sk]) {
			if x.slicePods[pk] == nil {
				x.slicePods[pk] = map[key]bool{}
			}
			x.slicePods[pk][svc] = true
			if x.servicePods[svc] == nil {
				x.servicePods[svc] = map[key]bool{}
			}
			x.servicePods[svc][pk] = true
		}
	}
	if len(x.slicesByService[svc]) == 0 {
		delete(x.slicesByService, svc)
	}
}

// recomputeSliceWorkloads rebuilds the workloads of a slice's pod-less
// endpoints, removing those it no longer has.
func (x *Index) recomputeSliceWorkloads(c *change, k key) {
	var built []*workloadapi.Workload
	if s := x.slices[k]; s != nil {
		if svc, ok := sliceService(s); ok {
			built = ambient.BuildEndpointSliceWorkloads(s, x.services[svc], x.cfg)
		}
	}
	var uids []string
	for _, w := range built {
		uids = append(uids, w.Uid)
		x.setAddress(c, w.Uid, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
	}
	for _, old := range x.sliceWorkloads[k] {
		if !slices.Contains(uids, old) {
			x.setAddress(c, old, nil)
		}
	}
	if len(uids) == 0 {
		delete(x.sliceWorkloads, k)
	} else {
		x.sliceWorkloads[k] = uids
	}
}
