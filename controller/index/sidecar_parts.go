package index

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// sidecarParts are what sidecar xDS reads of the index's objects beyond
// the published tables: the part of each object its generators read.
// SidecarInputs is assembled from these and the tables alone, and every
// update stores the object's part here and learns whether it changed
// (ChangeSet.SidecarInputs). A generator cannot read more of an object
// than its part holds, and what a part holds is what the update compares:
// nobody keeps a second list of what sidecars read.
type sidecarParts struct {
	pods            map[key]podPart
	workloadEntries map[key]map[string]string // labels
	services        map[key]sidecar.ServiceInfo
	// Whole objects: any update of one changes what sidecars read.
	serviceEntries        map[key]*networkingv1.ServiceEntry
	virtualServices       map[key]*networkingv1.VirtualService
	destinationRules      map[key]*networkingv1.DestinationRule
	sidecars              map[key]*networkingv1.Sidecar
	peerAuthentications   map[key]*securityv1.PeerAuthentication
	authorizationPolicies map[key]*securityv1.AuthorizationPolicy
}

// podPart is what sidecars read of a pod: its labels (subsets, Sidecar
// and policy selectors) and whether it is being deleted.
type podPart struct {
	labels      map[string]string
	terminating bool
}

func podPartOf(p *corev1.Pod) podPart {
	return podPart{labels: p.Labels, terminating: p.DeletionTimestamp != nil}
}

// setPart stores part under k, or forgets k when !present, and reports
// whether what the map holds changed by same.
func setPart[T any](m *map[key]T, k key, part T, present bool, same func(a, b T) bool) bool {
	old, had := (*m)[k]
	if !present {
		delete(*m, k)
		return had
	}
	if *m == nil {
		*m = map[key]T{}
	}
	(*m)[k] = part
	return !had || !same(old, part)
}

// setObject is setPart for a whole object (nil forgets it): an update
// delivers a new object, so any update is a change.
func setObject[T any](m *map[key]*T, k key, obj *T) bool {
	return setPart(m, k, obj, obj != nil, func(a, b *T) bool { return a == b })
}

func (s *sidecarParts) setPod(k key, p *corev1.Pod) bool {
	var part podPart
	if p != nil {
		part = podPartOf(p)
	}
	return setPart(&s.pods, k, part, p != nil, func(a, b podPart) bool {
		return a.terminating == b.terminating && maps.Equal(a.labels, b.labels)
	})
}

func (s *sidecarParts) setWorkloadEntry(k key, we *networkingv1.WorkloadEntry) bool {
	var lbls map[string]string
	if we != nil {
		lbls = entryLabels(we)
	}
	return setPart(&s.workloadEntries, k, lbls, we != nil, maps.Equal)
}

func (s *sidecarParts) setService(k key, svc *corev1.Service) bool {
	var info sidecar.ServiceInfo
	if svc != nil {
		info = kubeServiceInfo(svc)
	}
	return setPart(&s.services, k, info, svc != nil, func(a, b sidecar.ServiceInfo) bool { return reflect.DeepEqual(a, b) })
}

// inputs assembles sidecar.Inputs from the published addresses and the
// parts.
func (s *sidecarParts) inputs(cfg ambient.Config, addresses map[string]*workloadapi.Address) sidecar.Inputs {
	in := sidecar.Inputs{
		DomainSuffix: cfg.DomainSuffix, ClusterID: cfg.ClusterID,
		TrustDomain: cfg.TrustDomain, RootNamespace: cfg.RootNamespace,
		Addresses:             make([]*workloadapi.Address, 0, len(addresses)),
		VirtualServices:       slices.Collect(maps.Values(s.virtualServices)),
		DestinationRules:      slices.Collect(maps.Values(s.destinationRules)),
		Sidecars:              slices.Collect(maps.Values(s.sidecars)),
		PeerAuthentications:   slices.Collect(maps.Values(s.peerAuthentications)),
		AuthorizationPolicies: slices.Collect(maps.Values(s.authorizationPolicies)),
	}
	labels := map[string]map[string]string{}
	terminating := map[string]bool{}
	entries := map[string]*sidecar.EntryEndpoint{}
	for _, a := range addresses {
		in.Addresses = append(in.Addresses, a)
		w := a.GetWorkload()
		if w == nil {
			continue
		}
		uid, err := workloadapi.ParseWorkloadUID(w.GetUid())
		if err != nil {
			continue
		}
		k := key{uid.Namespace, uid.Name}
		switch uid.Kind {
		case workloadapi.KindPod:
			if p, ok := s.pods[k]; ok {
				labels[w.GetUid()] = p.labels
				terminating[w.GetUid()] = p.terminating
			}
		case workloadapi.KindWorkloadEntry:
			if lbls, ok := s.workloadEntries[k]; ok {
				labels[w.GetUid()] = lbls
			}
		case workloadapi.KindServiceEntry:
			se := s.serviceEntries[k]
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
	hosts := s.serviceEntryHosts()
	for _, a := range in.Addresses {
		svc := a.GetService()
		if svc == nil {
			continue
		}
		ns, host := svc.GetNamespace(), svc.GetHostname()
		if name, ok := strings.CutSuffix(host, "."+ns+".svc."+cfg.DomainSuffix); ok {
			if info, ok := s.services[key{ns, name}]; ok {
				infos[[2]string{ns, host}] = info
				continue
			}
		}
		if se := hosts[[2]string{ns, host}]; se != nil {
			infos[[2]string{ns, host}] = serviceEntryInfo(se, host)
		}
	}
	in.Info = func(namespace, hostname string) sidecar.ServiceInfo { return infos[[2]string{namespace, hostname}] }
	return in
}

// serviceEntryHosts are the ServiceEntries by namespace and host; of two
// with a host, the older (then the first by name) describes it.
func (s *sidecarParts) serviceEntryHosts() map[[2]string]*networkingv1.ServiceEntry {
	out := map[[2]string]*networkingv1.ServiceEntry{}
	for _, se := range s.serviceEntries {
		for _, h := range se.Spec.GetHosts() {
			k := [2]string{se.Namespace, h}
			if prev := out[k]; prev == nil || older(se, prev) {
				out[k] = se
			}
		}
	}
	return out
}

func older(a, b *networkingv1.ServiceEntry) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// SidecarInputs is a consistent copy of what sidecar xDS is generated
// from: the published workload table and the sidecar parts of the
// objects (sidecarParts). The objects are shared (informer objects and
// published protos are never modified).
func (x *Index) SidecarInputs() sidecar.Inputs {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.sidecar.inputs(x.cfg, x.addresses)
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
		for i, ep := range se.Spec.GetEndpoints() {
			// Named as telemetry names the endpoint: a WorkloadEntry
			// "<serviceentry>-<index>" unless its labels name it.
			name := cmp.Or(ep.GetLabels()[ambient.LabelWorkloadName], se.Name+"-"+strconv.Itoa(i))
			canonical, rev := ambient.CanonicalNames(ep.GetLabels(), name)
			h := sidecar.DNSHost{Host: ep.GetAddress(), Ports: map[uint32]uint32{}, Weight: ep.GetWeight(),
				Entry: &sidecar.EntryEndpoint{Workload: name, CanonicalName: canonical, CanonicalRevision: rev}}
			for name, target := range ep.GetPorts() {
				if port, ok := byName[name]; ok {
					h.Ports[port] = target
				}
			}
			info.DNSHosts = append(info.DNSHosts, h)
		}
		if len(info.DNSHosts) == 0 {
			canonical, rev := ambient.CanonicalNames(nil, se.Name)
			info.DNSHosts = []sidecar.DNSHost{{Host: hostname, Entry: &sidecar.EntryEndpoint{Workload: se.Name, CanonicalName: canonical, CanonicalRevision: rev}}}
		}
	}
	return info
}
