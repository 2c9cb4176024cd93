package index

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// traffic holds the configuration only sidecar xDS reads.
type traffic struct {
	virtualServices  map[key]*networkingv1.VirtualService
	destinationRules map[key]*networkingv1.DestinationRule
}

// UpsertVirtualService stores a VirtualService.
func (x *Index) UpsertVirtualService(vs *networkingv1.VirtualService) ChangeSet {
	return setTraffic(x, &x.traffic.virtualServices, key{vs.Namespace, vs.Name}, vs)
}

// DeleteVirtualService forgets a VirtualService.
func (x *Index) DeleteVirtualService(namespace, name string) ChangeSet {
	return setTraffic(x, &x.traffic.virtualServices, key{namespace, name}, nil)
}

// UpsertDestinationRule stores a DestinationRule.
func (x *Index) UpsertDestinationRule(dr *networkingv1.DestinationRule) ChangeSet {
	return setTraffic(x, &x.traffic.destinationRules, key{dr.Namespace, dr.Name}, dr)
}

// DeleteDestinationRule forgets a DestinationRule.
func (x *Index) DeleteDestinationRule(namespace, name string) ChangeSet {
	return setTraffic(x, &x.traffic.destinationRules, key{namespace, name}, nil)
}

// setTraffic stores obj under k in *objs (nil forgets it), under x's lock. Only sidecar
// xDS reads these, so the change is Traffic alone.
func setTraffic[T any](x *Index, objs *map[key]*T, k key, obj *T) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	if obj == nil {
		delete(*objs, k)
		return ChangeSet{Traffic: true}
	}
	if *objs == nil {
		*objs = map[key]*T{}
	}
	(*objs)[k] = obj
	return ChangeSet{Traffic: true}
}

// SidecarInputs is a consistent copy of what sidecar xDS is generated
// from: the published workload table, the labels of its pods,
// WorkloadEntries and ServiceEntry endpoints, which pods are being deleted,
// how Istio names ServiceEntry endpoints, the traffic configuration and
// the security policies. The objects are shared
// (informer objects and published protos are never modified).
func (x *Index) SidecarInputs() sidecar.Inputs {
	x.mu.RLock()
	defer x.mu.RUnlock()
	in := sidecar.Inputs{
		DomainSuffix: x.cfg.DomainSuffix, ClusterID: x.cfg.ClusterID,
		TrustDomain: x.cfg.TrustDomain, RootNamespace: x.cfg.RootNamespace,
		Addresses:             make([]*workloadapi.Address, 0, len(x.addresses)),
		VirtualServices:       slices.Collect(maps.Values(x.traffic.virtualServices)),
		DestinationRules:      slices.Collect(maps.Values(x.traffic.destinationRules)),
		PeerAuthentications:   slices.Collect(maps.Values(x.peerAuths)),
		AuthorizationPolicies: slices.Collect(maps.Values(x.policies)),
	}
	labels := map[string]map[string]string{}
	terminating := map[string]bool{}
	entries := map[string]*sidecar.EntryEndpoint{}
	for _, a := range x.addresses {
		in.Addresses = append(in.Addresses, a)
		w := a.GetWorkload()
		if w == nil {
			continue
		}
		uid, err := workloadapi.ParseWorkloadUID(w.GetUid())
		if err != nil {
			continue
		}
		switch uid.Kind {
		case workloadapi.KindPod:
			if p := x.pods[key{uid.Namespace, uid.Name}]; p != nil {
				labels[w.GetUid()] = p.Labels
				terminating[w.GetUid()] = p.DeletionTimestamp != nil
			}
		case workloadapi.KindWorkloadEntry:
			if we := x.workloadEntries[key{uid.Namespace, uid.Name}]; we != nil {
				labels[w.GetUid()] = entryLabels(we)
			}
		case workloadapi.KindServiceEntry:
			se := x.serviceEntries[key{uid.Namespace, uid.Name}]
			if se == nil {
				continue
			}
			for i, ep := range se.Spec.GetEndpoints() {
				if ep.GetAddress() != uid.Endpoint {
					continue
				}
				labels[w.GetUid()] = ep.GetLabels()
				name := cmp.Or(ep.GetLabels()[ambient.LabelWorkloadName], se.Name+"-"+strconv.Itoa(i))
				canonical, rev := ambient.CanonicalNames(ep.GetLabels(), name)
				entries[w.GetUid()] = &sidecar.EntryEndpoint{Workload: name, CanonicalName: canonical, CanonicalRevision: rev}
				break
			}
		}
	}
	in.Labels = func(uid string) map[string]string { return labels[uid] }
	in.Terminating = func(uid string) bool { return terminating[uid] }
	in.Entry = func(uid string) *sidecar.EntryEndpoint { return entries[uid] }
	return in
}
