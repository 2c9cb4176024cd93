package index

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// traffic holds the configuration only sidecar xDS reads.
type traffic struct {
	virtualServices  map[key]*networkingv1.VirtualService
	destinationRules map[key]*networkingv1.DestinationRule
	sidecars         map[key]*networkingv1.Sidecar
	// problems are what sidecars do not get of an object (Istio's rules
	// refuse it, or part of it), by "<kind> <namespace>/<name>": the
	// sidecar generators' own verdicts (sidecar.VirtualServiceProblem and
	// its kin), so that what is reported is what is left out.
	problems map[string]string
}

// UpsertVirtualService stores a VirtualService.
func (x *Index) UpsertVirtualService(vs *networkingv1.VirtualService) ChangeSet {
	return setTraffic(x, &x.traffic.virtualServices, key{vs.Namespace, vs.Name}, vs, "VirtualService", sidecar.VirtualServiceProblem)
}

// DeleteVirtualService forgets a VirtualService.
func (x *Index) DeleteVirtualService(namespace, name string) ChangeSet {
	return setTraffic(x, &x.traffic.virtualServices, key{namespace, name}, nil, "VirtualService", sidecar.VirtualServiceProblem)
}

// UpsertDestinationRule stores a DestinationRule.
func (x *Index) UpsertDestinationRule(dr *networkingv1.DestinationRule) ChangeSet {
	return setTraffic(x, &x.traffic.destinationRules, key{dr.Namespace, dr.Name}, dr, "DestinationRule", sidecar.DestinationRuleProblem)
}

// DeleteDestinationRule forgets a DestinationRule.
func (x *Index) DeleteDestinationRule(namespace, name string) ChangeSet {
	return setTraffic(x, &x.traffic.destinationRules, key{namespace, name}, nil, "DestinationRule", sidecar.DestinationRuleProblem)
}

// UpsertSidecar stores a Sidecar resource. A Sidecar Istio's rules refuse
// is used as it is: it only narrows what a proxy sees.
func (x *Index) UpsertSidecar(sc *networkingv1.Sidecar) ChangeSet {
	return setTraffic(x, &x.traffic.sidecars, key{sc.Namespace, sc.Name}, sc, "Sidecar", nil)
}

// DeleteSidecar forgets a Sidecar resource.
func (x *Index) DeleteSidecar(namespace, name string) ChangeSet {
	return setTraffic(x, &x.traffic.sidecars, key{namespace, name}, nil, "Sidecar", nil)
}

// setTraffic stores obj under k in *objs (nil forgets it), under x's lock,
// with what sidecars do not get of it (problem, if not nil, says). Only
// sidecar xDS reads these, so the change is Traffic alone.
func setTraffic[T any](x *Index, objs *map[key]*T, k key, obj *T, kind string, problem func(*T) string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	msg := ""
	if obj != nil && problem != nil {
		msg = problem(obj)
	}
	x.setConfigProblem(kind+" "+k.String(), msg)
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

// setConfigProblem records (or, for "", forgets) what sidecars do not get
// of an object. The caller holds x.mu.
func (x *Index) setConfigProblem(object, msg string) {
	if msg == "" {
		delete(x.traffic.problems, object)
		return
	}
	if x.traffic.problems == nil {
		x.traffic.problems = map[string]string{}
	}
	x.traffic.problems[object] = msg
}

// ConfigProblems returns, by object ("<kind> <namespace>/<name>"), what
// sidecars do not get of a VirtualService, DestinationRule or
// ServiceEntry that Istio's rules refuse, in whole or in part, and why; the
// caller reports them as Events.
func (x *Index) ConfigProblems() map[string]string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return maps.Clone(x.traffic.problems)
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
		Sidecars:              slices.Collect(maps.Values(x.traffic.sidecars)),
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
	infos := map[[2]string]sidecar.ServiceInfo{}
	for _, a := range in.Addresses {
		if s := a.GetService(); s != nil {
			infos[[2]string{s.GetNamespace(), s.GetHostname()}] = x.serviceInfo(s.GetNamespace(), s.GetHostname())
		}
	}
	in.Info = func(namespace, hostname string) sidecar.ServiceInfo { return infos[[2]string{namespace, hostname}] }
	return in
}

// serviceInfo describes a Service or ServiceEntry host for sidecars. The
// caller holds x.mu.
func (x *Index) serviceInfo(namespace, hostname string) sidecar.ServiceInfo {
	if name, ok := strings.CutSuffix(hostname, "."+namespace+".svc."+x.cfg.DomainSuffix); ok {
		if svc := x.services[key{namespace, name}]; svc != nil {
			return kubeServiceInfo(svc)
		}
	}
	for k := range x.serviceEntriesByNamespace[namespace] {
		se := x.serviceEntries[k]
		if se != nil && slices.Contains(se.Spec.GetHosts(), hostname) {
			return serviceEntryInfo(se, hostname)
		}
	}
	return sidecar.ServiceInfo{}
}

func kubeServiceInfo(svc *corev1.Service) sidecar.ServiceInfo {
	info := sidecar.ServiceInfo{Protocols: map[uint32]string{}}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		info.Resolution = sidecar.None
	}
	for _, p := range svc.Spec.Ports {
		if proto := ambient.IstioProtocol(p); proto != "" {
			info.Protocols[uint32(p.Port)] = proto
		}
	}
	return info
}

func serviceEntryInfo(se *networkingv1.ServiceEntry, hostname string) sidecar.ServiceInfo {
	spec := se.Spec.GetResolution()
	info := sidecar.ServiceInfo{
		Protocols: map[uint32]string{}, External: se.Spec.GetLocation() == networkingapi.ServiceEntry_MESH_EXTERNAL,
		AutoAllocated: len(se.Spec.GetAddresses()) == 0,
	}
	switch spec {
	case networkingapi.ServiceEntry_DNS:
		info.Resolution = sidecar.DNS
	case networkingapi.ServiceEntry_DNS_ROUND_ROBIN:
		info.Resolution = sidecar.DNSRoundRobin
	case networkingapi.ServiceEntry_NONE:
		info.Resolution = sidecar.None
	}
	for _, p := range se.Spec.GetPorts() {
		if proto := ambient.IstioProtocolName(p.GetProtocol()); proto != "" {
			info.Protocols[p.GetNumber()] = proto
		}
	}
	if info.Resolution == sidecar.DNS || info.Resolution == sidecar.DNSRoundRobin {
		byName := map[string]uint32{}
		for _, p := range se.Spec.GetPorts() {
			byName[p.GetName()] = p.GetNumber()
		}
		for _, ep := range se.Spec.GetEndpoints() {
			h := sidecar.DNSHost{Host: ep.GetAddress(), Ports: map[uint32]uint32{}}
			for name, target := range ep.GetPorts() {
				if port, ok := byName[name]; ok {
					h.Ports[port] = target
				}
			}
			info.DNSHosts = append(info.DNSHosts, h)
		}
		if len(info.DNSHosts) == 0 {
			info.DNSHosts = []sidecar.DNSHost{{Host: hostname}}
		}
	}
	return info
}
