package sidecar

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// A Share is a part of what a client is answered for one type. Every
// client whose share has the same Key (in the same Mesh) is answered it
// alike, so a control plane generates and marshals it once for all of
// them: a hundred sidecars of one namespace share their outbound
// clusters, and only their inbound sides are their own.
type Share struct {
	// Key and Name say what the share depends on besides the Mesh and the
	// type: only those parts of the proxy that its generator reads, and
	// for a share per name, the name (else "").
	Key, Name string
	// Generate returns the share's resources, recording what it read of
	// the Mesh into r (nil: nothing is recorded). Two shares of the same
	// Key, from two Meshes that DepsOf(r) finds the same, generate the
	// same resources, so the second need not be generated.
	Generate func(r *Reads) []Named
	// Absent tells whether the Mesh has nothing under the share's name
	// (no service, port or subset of it); nil: never. Generate then
	// answers a function of the name alone, for the client's kind:
	// nothing, or the placeholder that tells a client to stop waiting (an
	// assignment without endpoints, a route configuration without virtual
	// hosts), the same in every Mesh the name is absent from. A client may
	// name any number of these, so a control plane neither caches nor
	// holds what they generate. It is a function, asked only when needed,
	// because it costs the lookups the generator makes: a control plane
	// that already holds the share's resources need not ask.
	Absent func() bool
}

// IsAbsent reports whether the Mesh has nothing under the share's name
// (Absent).
func (s Share) IsAbsent() bool { return s.Absent != nil && s.Absent() }

// SidecarShares splits what GenerateSidecar answers into shares. A
// wildcard type has two: the outbound share (clusters or listeners of the
// services the proxy may see, and those every sidecar gets), the same for
// every proxy of one namespace and Sidecar scope; and the proxy's own
// share (its inbound side, from its workload's addresses and labels),
// which of the endpoints reads only the proxy's own.
// Endpoints and routes have a share per name.
func (m *Mesh) SidecarShares(p Proxy, typeURL string, names []string) []Share {
	p.HBONE = true
	switch typeURL {
	case ClusterType:
		return []Share{
			{m.key(p, "out").scope(m.SidecarScope(p)).String(), "", func(r *Reads) []Named { return m.reading(r).sidecarOutboundClusters(p) }, nil},
			{m.key(p, "own").labels(p.Labels).ips(p).String(), "", func(r *Reads) []Named { return m.reading(r).sidecarInboundClusters(p) }, nil},
		}
	case ListenerType:
		return []Share{
			// VirtualServices' tcp and tls routes match on source labels.
			// A headless service's listeners leave out the proxy's own
			// address when it is one of them.
			{m.key(p, "out").scope(m.SidecarScope(p)).labels(m.listenerLabels(p.Labels)).field(m.headlessSelf(p)).String(), "", func(r *Reads) []Named { return m.reading(r).sidecarOutboundListeners(p) }, nil},
			{m.key(p, "own").labels(p.Labels).ips(p).String(), "", func(r *Reads) []Named {
				return []Named{{VirtualInbound, m.reading(r).virtualInbound(p)}}
			}, nil},
		}
	case EndpointType:
		return m.endpointShares(p, names)
	case RouteType:
		return m.perName(p, names, (*Mesh).SidecarRoutes, m.sidecarRouteAbsent, func(k *shareKey) { k.scope(m.SidecarScope(p)).labels(m.routeLabels(p.Labels)) })
	}
	return nil
}

// GRPCShares splits what Generate answers a proxyless gRPC client into
// shares, one per name: a server listener is the proxy's own (its
// addresses, and its labels select policies); routes depend on the labels
// VirtualServices match sources on; the rest only on the namespace.
func (m *Mesh) GRPCShares(p Proxy, typeURL string, names []string) []Share {
	switch typeURL {
	case ClusterType:
		return m.perName(p, names, (*Mesh).GRPCClusters, m.noCluster, func(k *shareKey) {})
	case EndpointType:
		return m.endpointShares(p, names)
	case ListenerType:
		var out []Share
		clientKey := m.key(p, "name").String()
		for _, name := range names {
			key := clientKey
			absent := func() bool { _, _, _, ok := m.grpcClientTarget(p, name); return !ok }
			if addr, ok := strings.CutPrefix(name, ServerListenerPrefix); ok {
				key = m.key(p, "name").labels(p.Labels).ips(p).String()
				absent = func() bool { _, _, ok := m.grpcServerAddr(p, addr); return !ok }
			}
			out = append(out, Share{key, name, func(r *Reads) []Named { return m.reading(r).GRPCListeners(p, []string{name}) }, absent})
		}
		return out
	case RouteType:
		return m.perName(p, names, (*Mesh).GRPCRoutes, func(p Proxy, name string) bool {
			_, ok := m.grpcRouteService(p, name)
			return !ok
		}, func(k *shareKey) { k.labels(m.routeLabels(p.Labels)) })
	}
	return nil
}

// noCluster reports whether the proxy sees no cluster name.
func (m *Mesh) noCluster(p Proxy, name string) bool {
	_, ok := m.clusterTarget(p, name)
	return !ok
}

// perName is a share per name, keyed by the namespace, what with adds,
// and the name. absent tells the names the Mesh has nothing under.
func (m *Mesh) perName(p Proxy, names []string, gen func(*Mesh, Proxy, []string) []Named, absent func(Proxy, string) bool, with func(*shareKey)) []Share {
	out := make([]Share, 0, len(names))
	k := m.key(p, "name")
	with(k)
	key := k.String()
	for _, name := range names {
		out = append(out, Share{key, name, func(r *Reads) []Named { return gen(m.reading(r), p, []string{name}) }, func() bool { return absent(p, name) }})
	}
	return out
}

// endpointShares are a share per cluster name, for the proxies of one
// namespace and place (locality load balancing orders endpoints by it).
func (m *Mesh) endpointShares(p Proxy, names []string) []Share {
	out := make([]Share, 0, len(names))
	key := m.key(p, "name").place(m, p).String()
	for _, name := range names {
		out = append(out, Share{key, name, func(r *Reads) []Named { return m.reading(r).Endpoints(p, []string{name}) }, func() bool { return m.noCluster(p, name) }})
	}
	return out
}

// routeLabels are the labels of lbls that some VirtualService's match
// names as a source label: the only ones routes depend on.
func (m *Mesh) routeLabels(lbls map[string]string) map[string]string {
	m.readKind(virtualServices)
	return labelsAmong(lbls, m.sourceLabelKeys)
}

// listenerLabels are the labels of lbls that tcp and tls routes match on,
// which outbound listeners depend on.
func (m *Mesh) listenerLabels(lbls map[string]string) map[string]string {
	m.readKind(virtualServices)
	return labelsAmong(lbls, m.l4SourceLabelKeys)
}

func labelsAmong(lbls map[string]string, keys map[string]bool) map[string]string {
	var out map[string]string
	for k, v := range lbls {
		if keys[k] {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// shareKey builds a Share's Key: fields separated by NUL, which no name,
// label or address holds.
type shareKey struct{ b strings.Builder }

// key starts a key with the share's part and what every generator reads
// of a proxy: its namespace and whether it tunnels over HBONE.
func (m *Mesh) key(p Proxy, part string) *shareKey {
	k := &shareKey{}
	k.field(part)
	k.field(p.Namespace)
	if p.HBONE {
		k.field("hbone")
	} else {
		k.field("")
	}
	return k
}

func (k *shareKey) field(s string) *shareKey {
	k.b.WriteString(s)
	k.b.WriteByte(0)
	return k
}

// scope adds the Sidecar resource that scopes the proxy (egress hosts),
// nil for none.
func (k *shareKey) scope(sc *networkingv1.Sidecar) *shareKey {
	if sc == nil {
		return k.field("")
	}
	return k.field(sc.Namespace + "/" + sc.Name)
}

func (k *shareKey) labels(lbls map[string]string) *shareKey {
	for _, l := range slices.Sorted(maps.Keys(lbls)) {
		k.field(l + "=" + lbls[l])
	}
	return k.field("")
}

// place adds where the proxy is, as far as locality load balancing tells
// proxies apart: its locality and network, and its labels that some
// failover priority compares.
func (k *shareKey) place(m *Mesh, p Proxy) *shareKey {
	pl := m.placeOf(p)
	loc := pl.locality
	k.field(loc.GetRegion() + "/" + loc.GetZone() + "/" + loc.GetSubZone())
	k.field(pl.labels[labelNetwork])
	// A proxy without labels gets no failover priorities at all.
	k.field(strconv.FormatBool(len(pl.labels) > 0))
	return k.labels(labelsAmong(pl.labels, m.failoverKeys()))
}

func (k *shareKey) ips(p Proxy) *shareKey {
	for _, ip := range p.IPs {
		k.field(ip.String())
	}
	return k.field("")
}

func (k *shareKey) String() string { return k.b.String() }
