package sidecar

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// Mesh is what the generators read. Build it with NewMesh; it is
// read-only afterwards and safe to share between connections.
type Mesh struct {
	// DomainSuffix is the cluster DNS domain ("cluster.local").
	DomainSuffix string
	// ClusterID names this cluster in endpoint metadata ("Kubernetes").
	ClusterID string
	// TrustDomain of identities that name none ("cluster.local").
	TrustDomain string
	// RootNamespace holds mesh-wide policies ("istio-system").
	RootNamespace string

	peerAuthentications   []*securityv1.PeerAuthentication
	authorizationPolicies []*securityv1.AuthorizationPolicy
	// drsByHost and vssByHost index the rules by the hostname they name,
	// resolved once (a VirtualService by its position in
	// virtualServices, which is their precedence); wildcardVSs are those
	// naming a "*.suffix" host.
	drsByHost        map[string][]*networkingv1.DestinationRule
	vssByHost        map[string][]int
	wildcardVSs      []wildcardVS
	services         map[string][]*Service // by hostname, oldest first
	virtualServices  []*networkingv1.VirtualService
	destinationRules []*networkingv1.DestinationRule
	// refusedRules are the DestinationRules Istio's rules refuse: a proxy
	// that would use one gets no cluster of its host (valid.go).
	refusedRules map[*networkingv1.DestinationRule]bool
	sidecars     []*networkingv1.Sidecar
	// sourceLabelKeys are the label keys VirtualService HTTP matches name
	// as source labels: routes depend on a proxy's labels only through
	// them; l4SourceLabelKeys, those of tcp and tls matches: outbound
	// listeners depend on a proxy's labels only through them.
	sourceLabelKeys, l4SourceLabelKeys map[string]bool
	// failoverLabels are the labels failover priorities compare
	// (failoverKeys).
	failoverLabels map[string]bool
	// fp summarises the inputs for DepsOf.
	fp fingerprints
	// reads records what a generation reads, in a view of the Mesh
	// (reading); nil in the Mesh itself.
	reads *Reads
	// endpointRefs are every service's endpoints, in order of hostname,
	// service and endpoint; byAddress indexes them by workload address,
	// so a proxy's own endpoints are found without a walk of the mesh.
	endpointRefs []endpointRef
	byAddress    map[netip.Addr][]int
}

// endpointRef is one service's endpoint.
type endpointRef struct {
	svc *Service
	ep  *Endpoint
}

// Service is a service of the workload tables with its endpoints.
type Service struct {
	*workloadapi.Service
	// Endpoints are the workloads that serve it, sorted by UID.
	Endpoints []Endpoint
	// Info is what the workload table does not say of it.
	Info ServiceInfo
	// foreign: its hostname is another namespace's Service name
	// (ambient.ForeignServiceHost), so only its namespace's proxies get it.
	foreign bool
	// tunnelPorts are its ports whose endpoints all take HBONE, and
	// istioTLSPorts those whose endpoints are all labelled for Istio
	// mutual TLS, sorted (indexTunnels).
	tunnelPorts, istioTLSPorts []uint32
}

// ServiceInfo is what a sidecar's configuration needs of a service beyond
// the workload table: the table says what a node proxy needs, which is
// less.
type ServiceInfo struct {
	// Protocols are the ports' protocols as Istio names them (HTTP, HTTP2,
	// GRPC, GRPC-Web, TCP, TLS, HTTPS, Mongo, Redis, MySQL, UDP), by
	// service port. A port without one has its protocol detected (sniffed).
	// Nil: taken from the table's app protocols.
	Protocols map[uint32]string
	// Resolution is how a sidecar finds the endpoints: Static (from the
	// table, over EDS), DNS, DNSRoundRobin, or None (the original
	// destination: a headless Service, a ServiceEntry of resolution NONE).
	Resolution Resolution
	// External marks a ServiceEntry of location MESH_EXTERNAL.
	External bool
	// AutoAllocated: the service's addresses were allocated by the mesh
	// (a ServiceEntry that declares none), not declared.
	AutoAllocated bool
	// DNSHosts are the names a DNS-resolved service's endpoints are looked
	// up by, with their ports by service port (0: the service port).
	DNSHosts []DNSHost
}

// Resolution is how a sidecar finds a service's endpoints.
type Resolution int

// Resolutions.
const (
	Static Resolution = iota
	DNS
	DNSRoundRobin
	None
)

// DNSHost is an endpoint of a DNS-resolved service: its name, its ports
// by service port, and its weight (0: 1).
type DNSHost struct {
	Host   string
	Ports  map[uint32]uint32
	Weight uint32
	// Entry names the endpoint for telemetry; nil: nothing is said.
	Entry *EntryEndpoint
}

// Endpoint is one workload serving a Service.
type Endpoint struct {
	*workloadapi.Workload
	// Ports maps the service's ports to the workload's target ports.
	Ports map[uint32]uint32
	// Labels are the workload's labels (a pod's, a WorkloadEntry's), which
	// DestinationRule subsets select on.
	Labels map[string]string
	// Terminating: the workload is being deleted (it is UNHEALTHY in the
	// workload table, and no endpoint at all here).
	Terminating bool
	// Entry is set for a ServiceEntry's inline endpoint.
	Entry *EntryEndpoint
}

// EntryEndpoint is how Istio's endpoint metadata names a ServiceEntry's
// inline endpoint: as a WorkloadEntry "<serviceentry>-<index>", so
// unlike the workload table, which names it after the ServiceEntry.
type EntryEndpoint struct {
	// Workload is the endpoint's workload-name label, else
	// "<serviceentry>-<index>".
	Workload string
	// CanonicalName and CanonicalRevision come from the endpoint's labels,
	// else Workload and "latest".
	CanonicalName, CanonicalRevision string
}

// Inputs are a Mesh's parts.
type Inputs struct {
	DomainSuffix, ClusterID, TrustDomain, RootNamespace string
	// Addresses is the workload table: services and workloads.
	Addresses []*workloadapi.Address
	// Labels returns a workload's labels by UID (nil when it has none).
	Labels func(uid string) map[string]string
	// Terminating reports whether a workload is being deleted, by UID
	// (nil: none is).
	Terminating func(uid string) bool
	// Entry describes a ServiceEntry's inline endpoint by UID (nil, or nil
	// returned, for other workloads).
	Entry               func(uid string) *EntryEndpoint
	VirtualServices     []*networkingv1.VirtualService
	DestinationRules    []*networkingv1.DestinationRule
	PeerAuthentications []*securityv1.PeerAuthentication
	// AuthorizationPolicies become the RBAC filters of proxyless servers.
	AuthorizationPolicies []*securityv1.AuthorizationPolicy
	// Sidecars scope what each proxy sees (egress hosts).
	Sidecars []*networkingv1.Sidecar
	// Info describes a service by namespace and hostname (nil, or the zero
	// ServiceInfo: as the table says).
	Info func(namespace, hostname string) ServiceInfo
}

// NewMesh indexes in. The workload table's services become Services; each
// workload is an endpoint of every service its services map names, at the
// target ports listed there (a target port of 0 is the service port).
func NewMesh(in Inputs) *Mesh {
	m := &Mesh{
		DomainSuffix:          cmp.Or(in.DomainSuffix, "cluster.local"),
		ClusterID:             cmp.Or(in.ClusterID, "Kubernetes"),
		TrustDomain:           cmp.Or(in.TrustDomain, "cluster.local"),
		RootNamespace:         cmp.Or(in.RootNamespace, "istio-system"),
		peerAuthentications:   sortedConfigs(in.PeerAuthentications),
		authorizationPolicies: sortedConfigs(in.AuthorizationPolicies),
		services:              map[string][]*Service{},
		virtualServices:       mergeDelegates(sortedConfigs(usableVirtualServices(in.VirtualServices)), cmp.Or(in.DomainSuffix, "cluster.local")),
		destinationRules:      sortedConfigs(in.DestinationRules),
		sidecars:              sortedConfigs(in.Sidecars),
		refusedRules:          refusedRules(in.DestinationRules),
	}
	m.indexRules()
	byKey := map[string]*Service{}
	for _, a := range in.Addresses {
		// A hostname Istio refuses (a ServiceEntry's) never becomes a
		// route configuration's domain.
		if s := a.GetService(); s != nil && serviceHost(s.GetHostname()) == nil {
			svc := &Service{Service: s, foreign: ambient.ForeignServiceHost(s.GetHostname(), s.GetNamespace(), ambient.Config{DomainSuffix: m.DomainSuffix})}
			if in.Info != nil {
				svc.Info = in.Info(s.GetNamespace(), s.GetHostname())
			}
			byKey[workloadapi.ServiceKey(s.GetNamespace(), s.GetHostname())] = svc
			m.services[s.GetHostname()] = append(m.services[s.GetHostname()], svc)
		}
	}
	for _, a := range in.Addresses {
		w := a.GetWorkload()
		if w == nil {
			continue
		}
		for key, pl := range w.GetServices() {
			svc := byKey[key]
			if svc == nil {
				continue
			}
			ports := map[uint32]uint32{}
			for _, p := range pl.GetPorts() {
				ports[p.GetServicePort()] = cmp.Or(p.GetTargetPort(), p.GetServicePort())
			}
			var lbls map[string]string
			if in.Labels != nil {
				lbls = in.Labels(w.GetUid())
			}
			ep := Endpoint{Workload: w, Ports: ports, Labels: lbls}
			ep.Terminating = in.Terminating != nil && in.Terminating(w.GetUid())
			if in.Entry != nil {
				ep.Entry = in.Entry(w.GetUid())
			}
			svc.Endpoints = append(svc.Endpoints, ep)
		}
	}
	for _, svcs := range m.services {
		for _, s := range svcs {
			slices.SortFunc(s.Endpoints, func(a, b Endpoint) int { return cmp.Compare(a.GetUid(), b.GetUid()) })
		}
		// Same-hostname services: the canonical one first, then by namespace.
		slices.SortStableFunc(svcs, func(a, b *Service) int {
			if a.GetCanonical() != b.GetCanonical() {
				if a.GetCanonical() {
					return -1
				}
				return 1
			}
			return cmp.Compare(a.GetNamespace(), b.GetNamespace())
		})
	}
	m.indexEndpoints()
	m.indexTunnels()
	m.indexFailoverLabels()
	m.fingerprint()
	return m
}

func (m *Mesh) indexEndpoints() {
	m.byAddress = map[netip.Addr][]int{}
	for _, h := range slices.Sorted(maps.Keys(m.services)) {
		for _, s := range m.services[h] {
			for i := range s.Endpoints {
				ep := &s.Endpoints[i]
				for _, b := range ep.GetAddresses() {
					if a, ok := netip.AddrFromSlice(b); ok {
						a = a.Unmap()
						if refs := m.byAddress[a]; len(refs) == 0 || refs[len(refs)-1] != len(m.endpointRefs) {
							m.byAddress[a] = append(refs, len(m.endpointRefs))
						}
					}
				}
				m.endpointRefs = append(m.endpointRefs, endpointRef{s, ep})
			}
		}
	}
}

// ownEndpoints are the endpoints of proxy p's workloads (one of its
// addresses), in order of hostname, service and endpoint.
func (m *Mesh) ownEndpoints(p Proxy) []endpointRef {
	m.readOwn(p.IPs)
	return m.endpointsAt(p.IPs)
}

// refused reports whether Istio's rules refuse a DestinationRule
// (valid.go).
func (m *Mesh) refused(dr *networkingv1.DestinationRule) bool {
	m.readKind(destinationRules)
	return m.refusedRules[dr]
}

// endpointsOf are a service's endpoints.
func (m *Mesh) endpointsOf(svc *Service) []Endpoint {
	m.readEndpoints(svc.GetHostname())
	return svc.Endpoints
}

// endpointsAt are the endpoints at addresses ips, in order of hostname,
// service and endpoint; nothing is recorded.
func (m *Mesh) endpointsAt(ips []netip.Addr) []endpointRef {
	var idx []int
	for _, ip := range ips {
		idx = append(idx, m.byAddress[ip.Unmap()]...)
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	out := make([]endpointRef, 0, len(idx))
	for _, i := range idx {
		out = append(out, m.endpointRefs[i])
	}
	return out
}

// wildcardVS is a VirtualService naming a wildcard host.
type wildcardVS struct {
	pattern string
	index   int
}

// indexRules resolves each rule's hosts once.
func (m *Mesh) indexRules() {
	m.drsByHost = map[string][]*networkingv1.DestinationRule{}
	for _, dr := range m.destinationRules {
		h := fqdn(dr.Spec.GetHost(), dr.Namespace, m.DomainSuffix)
		m.drsByHost[h] = append(m.drsByHost[h], dr)
	}
	m.vssByHost = map[string][]int{}
	m.sourceLabelKeys = map[string]bool{}
	m.l4SourceLabelKeys = map[string]bool{}
	for i, vs := range m.virtualServices {
		for _, hr := range vs.Spec.GetHttp() {
			for _, mr := range hr.GetMatch() {
				for k := range mr.GetSourceLabels() {
					m.sourceLabelKeys[k] = true
				}
			}
		}
		for _, tr := range vs.Spec.GetTcp() {
			for _, mr := range tr.GetMatch() {
				for k := range mr.GetSourceLabels() {
					m.l4SourceLabelKeys[k] = true
				}
			}
		}
		for _, tr := range vs.Spec.GetTls() {
			for _, mr := range tr.GetMatch() {
				for k := range mr.GetSourceLabels() {
					m.l4SourceLabelKeys[k] = true
				}
			}
		}
		for _, h := range vs.Spec.GetHosts() {
			h = fqdn(h, vs.Namespace, m.DomainSuffix)
			if _, ok := cutWildcard(h); ok {
				m.wildcardVSs = append(m.wildcardVSs, wildcardVS{h, i})
			} else if idx := m.vssByHost[h]; len(idx) == 0 || idx[len(idx)-1] != i {
				m.vssByHost[h] = append(idx, i)
			}
		}
	}
}

// config is what Istio's configuration kinds share.
type config interface {
	GetNamespace() string
	GetName() string
	GetCreationTimestamp() metav1.Time
}

// sortedConfigs orders configs oldest first (where Istio lets the oldest
// win), then by namespace and name, so output never depends on informer
// order.
func sortedConfigs[T config](in []T) []T {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b T) int {
		return cmp.Or(a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time),
			cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// Proxy is the client the resources are for.
type Proxy struct {
	// Namespace is the proxy's namespace: short names resolve in it.
	Namespace string
	// Labels are its workload's labels (VirtualService sourceLabels).
	Labels map[string]string
	// IPs are its addresses; a server listener is answered for them.
	IPs []netip.Addr
	// HBONE: the proxy tunnels to endpoints that take HBONE (workloads of
	// the ambient mesh) through its connect_originate listener. Envoy
	// sidecars do (GenerateSidecar sets it); gRPC clients cannot.
	HBONE bool
}

// Service returns the service named hostname that proxy p may see: the
// canonical one of a shared hostname, else the first by namespace. A
// ServiceEntry whose host is another namespace's Service name
// (ambient.ForeignServiceHost: payments.prod.svc.<domain> in namespace
// attacker) is one only for the proxies of its own namespace, so that it
// never takes prod's name for the rest of the mesh, not even while prod
// has no Service of that name; with one, the Service is canonical and
// comes first for every proxy.
func (m *Mesh) Service(p Proxy, hostname string) *Service {
	m.readServices()
	for _, s := range m.services[hostname] {
		if !visible(s.Service, p.Namespace) || (s.foreign && s.GetNamespace() != p.Namespace) {
			continue
		}
		return s
	}
	return nil
}

func visible(s *workloadapi.Service, ns string) bool {
	return s.GetVisibility() == workloadapi.Service_PUBLIC || s.GetNamespace() == ns
}

// exported reports whether a config of namespace cfgNS with exportTo is
// visible to namespace ns (Istio's exportTo: "*" or empty everyone, "."
// its own namespace, else the named namespaces).
func exported(exportTo []string, cfgNS, ns string) bool {
	if len(exportTo) == 0 {
		return true
	}
	for _, e := range exportTo {
		switch e {
		case "*":
			return true
		case ".":
			if cfgNS == ns {
				return true
			}
		default:
			if e == ns {
				return true
			}
		}
	}
	return false
}

// DestinationRule returns the rule for hostname as proxy p sees it: one in
// p's namespace first, then one in the service's namespace, then any other
// exported to p (Istio's lookup order, without merging).
func (m *Mesh) DestinationRule(p Proxy, hostname, serviceNS string) *networkingv1.DestinationRule {
	m.readKind(destinationRules)
	var own, svc, other *networkingv1.DestinationRule
	for _, dr := range m.drsByHost[hostname] {
		if dr.Spec.GetWorkloadSelector() != nil || !exported(dr.Spec.GetExportTo(), dr.Namespace, p.Namespace) {
			continue
		}
		switch {
		case dr.Namespace == p.Namespace && own == nil:
			own = dr
		case dr.Namespace == serviceNS && svc == nil:
			svc = dr
		case other == nil:
			other = dr
		}
	}
	return cmp.Or(own, svc, other)
}

// VirtualServices returns the VirtualServices that route hostname for
// proxy p, in namespace and name order: those that name the host, apply
// to sidecars ("mesh" gateway, the default), and are exported to p.
func (m *Mesh) VirtualServices(p Proxy, hostname string) []*networkingv1.VirtualService {
	m.readKind(virtualServices)
	idx := m.vssByHost[hostname]
	for _, w := range m.wildcardVSs {
		if hostMatches(w.pattern, hostname) {
			idx = append(slices.Clip(idx), w.index)
		}
	}
	if len(m.wildcardVSs) > 0 {
		idx = slices.Compact(slices.Sorted(slices.Values(idx)))
	}
	var out []*networkingv1.VirtualService
	for _, i := range idx {
		vs := m.virtualServices[i]
		if exported(vs.Spec.GetExportTo(), vs.Namespace, p.Namespace) && appliesToMesh(vs.Spec.GetGateways()) {
			out = append(out, vs)
		}
	}
	return out
}

// appliesToMesh: a VirtualService without gateways applies to sidecars;
// with gateways, only when "mesh" is one of them.
func appliesToMesh(gateways []string) bool {
	return len(gateways) == 0 || slices.Contains(gateways, "mesh")
}

// hostMatches reports whether pattern (a hostname or "*.suffix") matches
// hostname.
func hostMatches(pattern, hostname string) bool {
	if suffix, ok := cutWildcard(pattern); ok {
		return len(hostname) > len(suffix) && hostname[len(hostname)-len(suffix):] == suffix
	}
	return pattern == hostname
}

func cutWildcard(pattern string) (string, bool) {
	if pattern == "*" {
		return "", true
	}
	if len(pattern) > 1 && pattern[0] == '*' && pattern[1] == '.' {
		return pattern[1:], true
	}
	return "", false
}
