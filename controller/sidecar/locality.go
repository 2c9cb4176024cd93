package sidecar

import (
	"maps"
	"math"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Topology labels every workload carries for failover priorities, as
// istiod adds them to a proxy's and an endpoint's labels.
const (
	labelNetwork  = "topology.istio.io/network"
	labelRegion   = "topology.kubernetes.io/region"
	labelZone     = "topology.kubernetes.io/zone"
	labelSubzone  = "topology.istio.io/subzone"
	labelHostname = "kubernetes.io/hostname"
)

// topologyLabels are a workload's labels with its network, locality and
// node as labels.
func topologyLabels(w *workloadapi.Workload, lbls map[string]string) map[string]string {
	out := make(map[string]string, len(lbls)+5)
	for k, v := range lbls {
		out[k] = v
	}
	set := func(k, v string) {
		if v != "" {
			out[k] = v
		}
	}
	set(labelNetwork, w.GetNetwork())
	set(labelRegion, w.GetLocality().GetRegion())
	set(labelZone, w.GetLocality().GetZone())
	set(labelSubzone, w.GetLocality().GetSubzone())
	set(labelHostname, w.GetNode())
	return out
}

// proxyPlace is where a proxy runs, as locality load balancing weighs
// endpoints against it: its locality and its topology labels.
type proxyPlace struct {
	locality *corev3.Locality
	labels   map[string]string
}

// placeOf is the place of proxy p's own workload (the first at its
// addresses); nothing for a proxy the table does not know.
func (m *Mesh) placeOf(p Proxy) proxyPlace {
	for _, ref := range m.ownEndpoints(p) {
		loc := ref.ep.GetLocality()
		return proxyPlace{
			locality: &corev3.Locality{Region: loc.GetRegion(), Zone: loc.GetZone(), SubZone: loc.GetSubzone()},
			labels:   topologyLabels(ref.ep.Workload, p.Labels),
		}
	}
	return proxyPlace{labels: p.Labels}
}

// localitySetting is the locality load balancing an assignment follows, as
// istiod resolves it: the rule's zone-aware or locality setting (disabled:
// none), else a traffic distribution's failover by network, region, zone
// (and subzone and node), else the mesh's default (enabled, nothing
// distributed, failover among localities when outlier detection is on).
// force: failover whether or not outlier detection is on.
type localitySetting struct {
	locality  *networkingapi.LocalityLoadBalancerSetting
	zoneAware *networkingapi.ZoneAwareLoadBalancerSetting
	force     bool
}

func effectiveLocality(lb *networkingapi.LoadBalancerSettings, svc *Service) (localitySetting, bool) {
	if za := lb.GetZoneAwareLbSetting(); za != nil {
		return localitySetting{zoneAware: za}, true
	}
	if ls := lb.GetLocalityLbSetting(); ls != nil {
		if e := ls.GetEnabled(); e != nil && !e.GetValue() {
			return localitySetting{}, false
		}
		return localitySetting{locality: ls}, true
	}
	if locationAware(svc) {
		priorities := []string{labelNetwork, labelRegion, labelZone}
		if slices.Contains(svc.GetLoadBalancing().GetRoutingPreference(), workloadapi.LoadBalancing_NODE) {
			priorities = append(priorities, labelSubzone, labelHostname)
		}
		return localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{FailoverPriority: priorities}, force: true}, true
	}
	return localitySetting{locality: &networkingapi.LocalityLoadBalancerSetting{}}, true
}

// needsPlace reports whether the setting orders an assignment by where
// the proxy is: when it distributes, is zone-aware, or fails over (with
// outlier detection, or forced).
func (s localitySetting) needsPlace(outlier bool) bool {
	return s.zoneAware != nil || s.locality.GetDistribute() != nil || outlier || s.force
}

// failoverLabelKeys are the labels a setting's failover priorities compare
// between proxy and endpoints ("key=value" entries name the key).
func (s localitySetting) failoverLabelKeys() []string {
	var in []string
	switch {
	case s.zoneAware != nil:
		if e := s.zoneAware.GetEnabled(); e == nil || e.GetValue() {
			in = s.zoneAware.GetFailoverPriority()
		}
	case s.locality.GetDistribute() == nil:
		in = s.locality.GetFailoverPriority()
	}
	var out []string
	for _, p := range in {
		k, _, _ := strings.Cut(p, "=")
		out = append(out, k)
	}
	return out
}

// localityGroup is one locality's endpoints of an assignment, with the
// workloads behind them (their labels decide failover priorities).
type localityGroup struct {
	lb        *endpointv3.LocalityLbEndpoints
	endpoints []Endpoint
}

// applyLocality sets the groups' priorities or weights relative to the
// proxy's place and returns the assignment's groups, as istiod does:
// distribute weighs localities (and drops the groups it does not name);
// failover (with outlier detection, or forced) ranks groups by label
// priorities, then by locality (same subzone, zone, region, a failover
// region, the rest), priorities counted from 0 without gaps; zone-aware
// routing ranks by label priorities, then by region.
func applyLocality(groups []localityGroup, place proxyPlace, s localitySetting, outlier bool) []*endpointv3.LocalityLbEndpoints {
	var out []*endpointv3.LocalityLbEndpoints
	for _, g := range groups {
		out = append(out, g.lb)
	}
	switch {
	case s.zoneAware != nil:
		if e := s.zoneAware.GetEnabled(); e != nil && !e.GetValue() {
			return out
		}
		if p := s.zoneAware.GetFailoverPriority(); len(p) > 0 {
			out = failoverPriorities(groups, place.labels, p)
		}
		var failover [][2]string
		for _, f := range s.zoneAware.GetFailover() {
			failover = append(failover, [2]string{f.GetFrom(), f.GetTo()})
		}
		regionFailover(out, place.locality, failover)
	case s.locality.GetDistribute() != nil:
		distribute(out, place.locality, s.locality.GetDistribute())
	case outlier || s.force:
		var failover [][2]string
		for _, f := range s.locality.GetFailover() {
			failover = append(failover, [2]string{f.GetFrom(), f.GetTo()})
		}
		if p := s.locality.GetFailoverPriority(); len(p) > 0 {
			out = failoverPriorities(groups, place.labels, p)
			if len(failover) > 0 {
				localityFailover(out, place.locality, failover)
			}
			break
		}
		localityFailover(out, place.locality, failover)
	}
	return out
}

// localityMatch reports a locality matched by a rule's "region/zone/subzone"
// pattern, where "*" (and a missing zone or subzone) matches any.
func localityMatch(loc *corev3.Locality, pattern string) bool {
	parts := append(strings.SplitN(pattern, "/", 3), "", "")
	match := func(rule, v string, optional bool) bool {
		return rule == "*" || optional && rule == "" || rule == v
	}
	return match(parts[0], loc.GetRegion(), false) && match(parts[1], loc.GetZone(), true) && match(parts[2], loc.GetSubZone(), true)
}

// distribute weighs the groups as the first rule whose "from" matches the
// proxy says: each "to" pattern's weight is split among the groups it
// matches (first pattern wins) in proportion to their own weights; groups
// no pattern matches get no endpoints.
func distribute(groups []*endpointv3.LocalityLbEndpoints, loc *corev3.Locality, rules []*networkingapi.LocalityLoadBalancerSetting_Distribute) {
	for _, r := range rules {
		if r == nil || !localityMatch(loc, r.GetFrom()) {
			continue
		}
		unmatched := map[int]bool{}
		for i := range groups {
			unmatched[i] = true
		}
		for _, pattern := range slices.Sorted(maps.Keys(r.GetTo())) {
			weight := r.GetTo()[pattern]
			matched := map[int]uint32{}
			total := uint32(0)
			for i, g := range groups {
				if unmatched[i] && localityMatch(g.GetLocality(), pattern) {
					delete(unmatched, i)
					w := uint32(1)
					if g.GetLoadBalancingWeight() != nil {
						w = g.GetLoadBalancingWeight().GetValue()
					}
					matched[i] = w
					total += w
				}
			}
			for i, w := range matched {
				if share := float64(w*weight) / float64(total); share > 0 {
					groups[i].LoadBalancingWeight = wrapperspb.UInt32(uint32(math.Ceil(share)))
				}
			}
		}
		for i := range unmatched {
			groups[i].LbEndpoints = nil
		}
		return
	}
}

// localityFailover ranks each group against the proxy's locality (0: same
// subzone, 1: same zone, 2: same region, 3: another region, 4: a region
// the proxy's region's failover rule does not name), within the priority
// it already has, then numbers the ranks from 0.
func localityFailover(groups []*endpointv3.LocalityLbEndpoints, loc *corev3.Locality, failover [][2]string) {
	rank := make([]int, len(groups))
	for i, g := range groups {
		r := 3
		switch gl := g.GetLocality(); {
		case gl.GetRegion() == loc.GetRegion() && gl.GetZone() == loc.GetZone() && gl.GetSubZone() == loc.GetSubZone():
			r = 0
		case gl.GetRegion() == loc.GetRegion() && gl.GetZone() == loc.GetZone():
			r = 1
		case gl.GetRegion() == loc.GetRegion():
			r = 2
		default:
			for _, f := range failover {
				if f[0] == loc.GetRegion() {
					if gl.GetRegion() != f[1] {
						r = 4
					}
					break
				}
			}
		}
		rank[i] = int(g.GetPriority())*5 + r
	}
	compactPriorities(groups, rank)
}

// regionFailover ranks each group by region only (0: the proxy's, 1: the
// failover region named for it, 2: the rest), within the priority it
// already has: zone-aware routing balances the zones of a region itself.
func regionFailover(groups []*endpointv3.LocalityLbEndpoints, loc *corev3.Locality, failover [][2]string) {
	rank := make([]int, len(groups))
	for i, g := range groups {
		r := 0
		if region := g.GetLocality().GetRegion(); region != loc.GetRegion() {
			r = 2
			for _, f := range failover {
				if f[0] == loc.GetRegion() {
					if region == f[1] {
						r = 1
					}
					break
				}
			}
		}
		rank[i] = int(g.GetPriority())*3 + r
	}
	compactPriorities(groups, rank)
}

// compactPriorities gives each group the position of its rank among the
// distinct ranks: priorities 0..N without gaps, as Envoy needs them.
func compactPriorities(groups []*endpointv3.LocalityLbEndpoints, rank []int) {
	distinct := slices.Compact(slices.Sorted(slices.Values(rank)))
	for i := range groups {
		groups[i].Priority = uint32(slices.Index(distinct, rank[i]))
	}
}

// failoverPriorities splits each group by how many of the priority labels
// (in order) its endpoints share with the proxy: all of them, priority 0;
// none of the first, the lowest. A first label that is the network is
// compared last. A label given as "key=value" compares against value
// instead of the proxy's own. The split groups are numbered from 0.
func failoverPriorities(groups []localityGroup, proxyLabels map[string]string, priorities []string) []*endpointv3.LocalityLbEndpoints {
	if len(proxyLabels) == 0 {
		var out []*endpointv3.LocalityLbEndpoints
		for _, g := range groups {
			out = append(out, g.lb)
		}
		return out
	}
	keys := make([]string, len(priorities))
	override := map[string]string{}
	for i, p := range priorities {
		k, v, ok := strings.Cut(p, "=")
		keys[i] = k
		if ok {
			override[k] = v
		}
	}
	lowest := len(priorities)
	networkFirst := lowest > 0 && priorities[0] == labelNetwork
	var out []*endpointv3.LocalityLbEndpoints
	for _, g := range groups {
		byPriority := map[int][]int{}
		for i, ep := range g.endpoints {
			lbls := topologyLabels(ep.Workload, ep.Labels)
			priority, adjust := 0, 0
			for j, k := range keys {
				want, ok := override[k]
				if !ok {
					want = proxyLabels[k]
				}
				if want != lbls[k] {
					if j == 0 && networkFirst {
						adjust = len(priorities)
						continue
					}
					priority = lowest - j
					break
				}
			}
			byPriority[priority+adjust] = append(byPriority[priority+adjust], i)
		}
		for _, pr := range slices.Sorted(maps.Keys(byPriority)) {
			split := proto.Clone(g.lb).(*endpointv3.LocalityLbEndpoints)
			split.LbEndpoints = nil
			split.Priority = uint32(pr)
			weight := uint32(0)
			for _, i := range byPriority[pr] {
				split.LbEndpoints = append(split.LbEndpoints, g.lb.GetLbEndpoints()[i])
				weight += g.lb.GetLbEndpoints()[i].GetLoadBalancingWeight().GetValue()
			}
			split.LoadBalancingWeight = wrapperspb.UInt32(weight)
			out = append(out, split)
		}
	}
	rank := make([]int, len(out))
	for i, g := range out {
		rank[i] = int(g.GetPriority())
	}
	compactPriorities(out, rank)
	return out
}

// failoverKeys are the labels any failover priority of the mesh compares:
// those of the DestinationRules' settings and of the services' traffic
// distributions.
func (m *Mesh) failoverKeys() map[string]bool {
	m.readKind(destinationRules)
	m.readServices()
	return m.failoverLabels
}

// indexFailoverLabels finds the labels failover priorities compare.
func (m *Mesh) indexFailoverLabels() {
	m.failoverLabels = map[string]bool{}
	add := func(tp *networkingapi.TrafficPolicy) {
		lbs := []*networkingapi.LoadBalancerSettings{tp.GetLoadBalancer()}
		for _, pl := range tp.GetPortLevelSettings() {
			lbs = append(lbs, pl.GetLoadBalancer())
		}
		for _, lb := range lbs {
			s, _ := effectiveLocality(lb, nil)
			for _, k := range s.failoverLabelKeys() {
				m.failoverLabels[k] = true
			}
		}
	}
	for _, dr := range m.destinationRules {
		add(dr.Spec.GetTrafficPolicy())
		for _, ss := range dr.Spec.GetSubsets() {
			add(ss.GetTrafficPolicy())
		}
	}
	for _, svcs := range m.services {
		for _, s := range svcs {
			s, _ := effectiveLocality(nil, s)
			for _, k := range s.failoverLabelKeys() {
				m.failoverLabels[k] = true
			}
		}
	}
}
