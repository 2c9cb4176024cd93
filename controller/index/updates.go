package index

import (
	"sort"

	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/securitypolicy"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Each Upsert and Delete stores or forgets one object (never modifying it:
// objects come from informer caches), recomputes the outputs it affects and
// returns what changed.

// UpsertNamespace records a namespace: its labels bind waypoints.
func (x *Index) UpsertNamespace(ns *corev1.Namespace) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.namespaces[ns.Name]
	x.namespaces[ns.Name] = ns
	if old != nil && !x.namespaceReads[ns.Name].changed(old.Labels, ns.Labels, old.Annotations, ns.Annotations) {
		return ChangeSet{} // nothing the tables read changed
	}
	if cs, changed := x.updateNetwork(); changed {
		return cs
	}
	return x.recomputeNamespace(ns.Name)
}

// DeleteNamespace forgets a namespace.
func (x *Index) DeleteNamespace(name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.namespaces, name)
	delete(x.namespaceReads, name)
	if cs, changed := x.updateNetwork(); changed {
		return cs
	}
	return x.recomputeNamespace(name)
}

// updateNetwork applies the system namespace's network label
// (docs/wire-contract.md §7.3): every workload and VIP is on that network, so
// all outputs change.
func (x *Index) updateNetwork() (ChangeSet, bool) {
	network := x.network
	if lbls, _ := x.namespaceView(x.cfg.SystemNamespace); lbls.Get(ambient.LabelNetwork) != "" {
		network = lbls.Get(ambient.LabelNetwork)
	}
	if network == x.cfg.Network {
		return ChangeSet{}, false
	}
	x.cfg.Network = network
	return x.recomputeAll(), true
}

// recomputeNamespace rebuilds every output of a namespace: each kind
// recomputeAll rebuilds.
func (x *Index) recomputeNamespace(name string) ChangeSet {
	var c change
	for k := range x.podsByNamespace[name] {
		x.recomputePod(&c, k)
	}
	for k := range x.servicesByNamespace[name] {
		x.recomputeService(&c, k)
	}
	for k := range x.serviceEntriesByNamespace[name] {
		x.recomputeServiceEntry(&c, k)
	}
	for k := range x.workloadEntriesByNamespace[name] {
		x.recomputeWorkloadEntry(&c, k)
	}
	for svc, slices := range x.slicesByService {
		if svc.namespace == name {
			for k := range slices {
				x.recomputeSliceWorkloads(&c, k)
			}
		}
	}
	return c.cs
}

// UpsertNode records a node: its topology labels are its pods' locality.
func (x *Index) UpsertNode(n *corev1.Node) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.nodes[n.Name]
	x.nodes[n.Name] = n
	// Nodes update their status every few seconds; only the labels the
	// tables read matter.
	if old != nil && !x.nodeReads[n.Name].changed(old.Labels, n.Labels, nil, nil) {
		return ChangeSet{}
	}
	return x.recomputeNode(n.Name)
}

// put stores obj under k and in its namespace's set, returning what it
// replaced; drop forgets k and returns what it held.
func put[T any](objs map[key]T, byNamespace map[string]map[key]bool, k key, obj T) T {
	old := objs[k]
	objs[k] = obj
	add(byNamespace, k.namespace, k)
	return old
}

func drop[T any](objs map[key]T, byNamespace map[string]map[key]bool, k key) T {
	old := objs[k]
	delete(objs, k)
	remove(byNamespace, k.namespace, k)
	return old
}

// DeleteNode forgets a node.
func (x *Index) DeleteNode(name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.nodes, name)
	delete(x.nodeReads, name)
	return x.recomputeNode(name)
}

func (x *Index) recomputeNode(name string) ChangeSet {
	var c change
	for k := range x.podsByNode[name] {
		x.recomputePod(&c, k)
	}
	return c.cs
}

// UpsertPod records a pod.
func (x *Index) UpsertPod(p *corev1.Pod) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{p.Namespace, p.Name}
	if old, ok := x.pods[k]; ok && old.Spec.NodeName != p.Spec.NodeName {
		remove(x.podsByNode, old.Spec.NodeName, k)
	}
	x.pods[k] = p
	add(x.podsByNamespace, p.Namespace, k)
	add(x.podsByNode, p.Spec.NodeName, k)
	var c change
	c.cs.SidecarInputs = x.sidecar.setPod(k, p)
	x.recomputePod(&c, k)
	return c.cs
}

// DeletePod forgets a pod.
func (x *Index) DeletePod(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	if old, ok := x.pods[k]; ok {
		remove(x.podsByNode, old.Spec.NodeName, k)
	}
	delete(x.pods, k)
	remove(x.podsByNamespace, namespace, k)
	var c change
	c.cs.SidecarInputs = x.sidecar.setPod(k, nil)
	x.recomputePod(&c, k)
	return c.cs
}

// UpsertService records a Service: its entry, and the services map of the
// pods and WorkloadEntries its old or new selector picks.
func (x *Index) UpsertService(s *corev1.Service) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{s.Namespace, s.Name}
	old := put(x.services, x.servicesByNamespace, k, s)
	return x.serviceChanged(k, old, s)
}

// DeleteService forgets a Service.
func (x *Index) DeleteService(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	old := drop(x.services, x.servicesByNamespace, k)
	return x.serviceChanged(k, old, nil)
}

func (x *Index) serviceChanged(k key, old, cur *corev1.Service) ChangeSet {
	var c change
	c.cs.SidecarInputs = x.sidecar.setService(k, cur)
	x.recomputeService(&c, k)
	for pk := range x.podsByNamespace[k.namespace] {
		pod := x.pods[pk]
		if (old != nil && selects(old.Spec.Selector, pod.Labels)) || (cur != nil && selects(cur.Spec.Selector, pod.Labels)) ||
			x.slicePods[pk][k] {
			x.recomputePod(&c, pk)
		}
	}
	for wk := range x.workloadEntriesByNamespace[k.namespace] {
		lbls := entryLabels(x.workloadEntries[wk])
		if (old != nil && selects(old.Spec.Selector, lbls)) || (cur != nil && selects(cur.Spec.Selector, lbls)) {
			x.recomputeWorkloadEntry(&c, wk)
		}
	}
	// The Service's ports shape its pod-less endpoints' workloads.
	for sk := range x.slicesByService[k] {
		x.recomputeSliceWorkloads(&c, sk)
	}
	return c.cs
}

// UpsertAuthorizationPolicy records a policy: its Authorization, and the
// policy lists of the workloads its old or new selector picks.
func (x *Index) UpsertAuthorizationPolicy(p *securityv1.AuthorizationPolicy) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{p.Namespace, p.Name}
	old := put(x.policies, x.policiesByNamespace, k, p)
	return x.policyChanged(k, old, p)
}

// DeleteAuthorizationPolicy forgets a policy.
func (x *Index) DeleteAuthorizationPolicy(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	old := drop(x.policies, x.policiesByNamespace, k)
	return x.policyChanged(k, old, nil)
}

func (x *Index) policyChanged(k key, old, cur *securityv1.AuthorizationPolicy) ChangeSet {
	var c change
	problem := "AuthorizationPolicy " + k.String()
	delete(x.problems, problem)
	if cur == nil {
		x.setAuthorization(&c, k.String(), nil)
	} else {
		res, err := ambient.BuildAuthorization(cur, x.cfg)
		switch {
		case err != nil:
			x.problems[problem] = err.Error()
		case len(res.Warnings) > 0:
			x.problems[problem] = joinWarnings(res.Warnings)
		}
		x.setAuthorization(&c, k.String(), res.Authorization)
	}
	// Sidecars and proxyless servers enforce the policy as written, HTTP
	// fields too, which its Authorization may not show.
	c.cs.SidecarInputs = setObject(&x.sidecar.authorizationPolicies, k, cur)
	// Workloads list selector-bound policies: recompute those selected
	// before or after. A root-namespace policy selects in every namespace.
	if securitypolicy.HasSelector(old) || securitypolicy.HasSelector(cur) {
		for pk := range x.podsInScope(k.namespace) {
			pod := x.pods[pk]
			if policySelects(old, pod.Labels) || policySelects(cur, pod.Labels) {
				x.recomputePod(&c, pk)
			}
		}
		for ns, entries := range x.workloadEntriesByNamespace {
			if !securitypolicy.InScope(k.namespace, ns, x.cfg.RootNamespace) {
				continue
			}
			for wk := range entries {
				lbls := entryLabels(x.workloadEntries[wk])
				if entryPolicySelects(old, lbls) || entryPolicySelects(cur, lbls) {
					x.recomputeWorkloadEntry(&c, wk)
				}
			}
		}
		// ServiceEntries' endpoints, by the ServiceEntry's labels.
		for ns, entries := range x.serviceEntriesByNamespace {
			if !securitypolicy.InScope(k.namespace, ns, x.cfg.RootNamespace) {
				continue
			}
			for sk := range entries {
				lbls := x.serviceEntries[sk].Labels
				if entryPolicySelects(old, lbls) || entryPolicySelects(cur, lbls) {
					x.recomputeServiceEntry(&c, sk)
				}
			}
		}
	}
	return c.cs
}

func joinWarnings(w []string) string {
	out := w[0]
	for _, s := range w[1:] {
		out += "; " + s
	}
	return out
}

// selectingPolicies are the keys of the published selector-bound policies
// that select a pod of namespace ns with labels lbls: its namespace's and
// the root namespace's.
func (x *Index) selectingPolicies(ns string, lbls map[string]string) []string {
	return x.policiesWhere(ns, func(p *securityv1.AuthorizationPolicy) bool { return policySelects(p, lbls) })
}

// entryPolicies is selectingPolicies for a WorkloadEntry or a
// ServiceEntry's endpoints, selected by lbls (see entryPolicySelects).
func (x *Index) entryPolicies(ns string, lbls map[string]string) []string {
	return x.policiesWhere(ns, func(p *securityv1.AuthorizationPolicy) bool { return entryPolicySelects(p, lbls) })
}

func (x *Index) policiesWhere(ns string, picks func(*securityv1.AuthorizationPolicy) bool) []string {
	var out []string
	for _, pns := range []string{ns, x.cfg.RootNamespace} {
		for pk := range x.policiesByNamespace[pns] {
			if picks(x.policies[pk]) && x.authorizations[pk.String()] != nil {
				out = append(out, pk.String())
			}
		}
		if pns == x.cfg.RootNamespace {
			break
		}
	}
	return out
}

// podsInScope is the pods a policy of namespace ns can select.
func (x *Index) podsInScope(ns string) map[key]bool {
	if ns != x.cfg.RootNamespace {
		return x.podsByNamespace[ns]
	}
	all := make(map[key]bool, len(x.pods))
	for k := range x.pods {
		all[k] = true
	}
	return all
}

// policySelects reports whether a selector-bound policy picks a workload
// with labels lbls (its scope aside): those are the policies a workload
// lists.
func policySelects(p *securityv1.AuthorizationPolicy, lbls map[string]string) bool {
	return securitypolicy.HasSelector(p) && securitypolicy.Selects(p, lbls)
}

// entryPolicySelects is policySelects for a WorkloadEntry or a
// ServiceEntry's endpoints: one without any labels is picked by every
// selector-bound policy in scope, whatever its selector, as istiod lists
// them (its buildWorkloadPolicies filters by labels only when the entry
// has some). Pods keep the plain rule. The list on an entry changes no
// decision of a node proxy, which enforces policies for its own pods only.
func entryPolicySelects(p *securityv1.AuthorizationPolicy, lbls map[string]string) bool {
	if len(lbls) == 0 {
		return securitypolicy.HasSelector(p)
	}
	return policySelects(p, lbls)
}

// UpsertPeerAuthentication records a PeerAuthentication: it changes the
// mTLS mode of the workloads in its scope (its namespace, or the mesh from
// the root namespace), and the converted port-level policies there.
func (x *Index) UpsertPeerAuthentication(pa *securityv1.PeerAuthentication) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{pa.Namespace, pa.Name}
	put(x.peerAuths, x.peerAuthsByNamespace, k, pa)
	cs := x.peerAuthChanged(pa.Namespace)
	// Sidecars read it as written.
	cs.SidecarInputs = setObject(&x.sidecar.peerAuthentications, k, pa)
	return cs
}

// DeletePeerAuthentication forgets a PeerAuthentication.
func (x *Index) DeletePeerAuthentication(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	drop(x.peerAuths, x.peerAuthsByNamespace, k)
	var c change
	x.setAuthorization(&c, namespace+"/"+convertedName(name), nil)
	cs := x.peerAuthChanged(namespace)
	cs.Authorizations.Removed = append(cs.Authorizations.Removed, c.cs.Authorizations.Removed...)
	cs.SidecarInputs = setObject(&x.sidecar.peerAuthentications, k, nil)
	return cs
}

func convertedName(paName string) string { return "converted_peer_authentication_" + paName }

// peerAuthChanged republishes the PeerAuthentication policies of a scope
// and recomputes its workloads. PeerAuthentications change rarely; a
// change in the root namespace touches the whole mesh.
func (x *Index) peerAuthChanged(namespace string) ChangeSet {
	var c change
	// The static strict policy exists while any PeerAuthentication does.
	var static *security.Authorization
	if len(x.peerAuths) > 0 {
		static = ambient.StaticStrictPolicy(x.cfg)
	}
	x.setAuthorization(&c, x.cfg.RootNamespace+"/"+ambient.StaticStrictPolicyName, static)

	inScope := func(ns string) bool { return namespace == x.cfg.RootNamespace || ns == namespace }
	for ns, pas := range x.peerAuthsByNamespace {
		if !inScope(ns) {
			continue
		}
		inherited := x.peerAuthsFor(ns, nil).Mode()
		for pk := range pas {
			x.setAuthorization(&c, ns+"/"+convertedName(pk.name), ambient.BuildPeerAuthentication(x.peerAuths[pk], inherited))
		}
	}
	for ns, pods := range x.podsByNamespace {
		if inScope(ns) {
			for pk := range pods {
				x.recomputePod(&c, pk)
			}
		}
	}
	for ns, entries := range x.workloadEntriesByNamespace {
		if inScope(ns) {
			for wk := range entries {
				x.recomputeWorkloadEntry(&c, wk)
			}
		}
	}
	for ns, entries := range x.serviceEntriesByNamespace {
		if inScope(ns) {
			for sk := range entries {
				x.recomputeServiceEntry(&c, sk)
			}
		}
	}
	return c.cs
}

// peerAuthsFor gathers the PeerAuthentications that decide the mTLS mode
// of a workload with labels lbls in namespace ns (nil labels: the
// namespace's own mode), as istiod does for ztunnel.
func (x *Index) peerAuthsFor(ns string, lbls map[string]string) securitypolicy.PeerAuthentications {
	candidates := func(yield func(*securityv1.PeerAuthentication) bool) {
		for _, n := range []string{ns, x.cfg.RootNamespace} {
			for pk := range x.peerAuthsByNamespace[n] {
				if !yield(x.peerAuths[pk]) {
					return
				}
			}
			if n == x.cfg.RootNamespace {
				return
			}
		}
	}
	return securitypolicy.Decide(candidates, x.cfg.RootNamespace, ns, lbls, securitypolicy.EmptySelectorSelectsAll)
}

// UpsertGateway records a Gateway; waypoints' addresses come from it.
// Objects anywhere may bind to a waypoint, so every pod and Service is
// recomputed: Gateways change rarely.
func (x *Index) UpsertGateway(gw *gatewayv1.Gateway) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{gw.Namespace, gw.Name}
	old := x.gateways[k]
	x.gateways[k] = gw
	if !waypointChanged(old, gw) {
		return ChangeSet{}
	}
	return x.recomputeAll()
}

// waypointChanged reports whether a Gateway update changes what binding
// to it yields: its class, what traffic it serves, or its addresses. Other
// Gateways (ingress) and other updates (conditions) change nothing.
func waypointChanged(old, cur *gatewayv1.Gateway) bool {
	if old == nil {
		return cur.Spec.GatewayClassName == ambient.WaypointClass
	}
	if old.Spec.GatewayClassName != ambient.WaypointClass && cur.Spec.GatewayClassName != ambient.WaypointClass {
		return false
	}
	return old.Spec.GatewayClassName != cur.Spec.GatewayClassName ||
		old.Labels[ambient.LabelWaypointFor] != cur.Labels[ambient.LabelWaypointFor] ||
		!equality.Semantic.DeepEqual(old.Status.Addresses, cur.Status.Addresses)
}

// DeleteGateway forgets a Gateway.
func (x *Index) DeleteGateway(namespace, name string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := key{namespace, name}
	old := x.gateways[k]
	delete(x.gateways, k)
	if old == nil || old.Spec.GatewayClassName != ambient.WaypointClass {
		return ChangeSet{}
	}
	return x.recomputeAll()
}

// recomputeAll rebuilds every output (recomputeNamespace rebuilds the
// same kinds).
func (x *Index) recomputeAll() ChangeSet {
	var c change
	for k := range x.pods {
		x.recomputePod(&c, k)
	}
	for k := range x.services {
		x.recomputeService(&c, k)
	}
	for k := range x.serviceEntries {
		x.recomputeServiceEntry(&c, k)
	}
	for k := range x.workloadEntries {
		x.recomputeWorkloadEntry(&c, k)
	}
	for k := range x.slices {
		x.recomputeSliceWorkloads(&c, k)
	}
	return c.cs
}

// recomputePod rebuilds one pod's Workload from the current inputs.
func (x *Index) recomputePod(c *change, k key) {
	uid := workloadapi.PodUID(x.cfg.ClusterID, k.namespace, k.name)
	// The pod may have joined or left a Service, or changed its ports.
	for sk := range x.servicesByNamespace[k.namespace] {
		x.dirtyPorts[sk] = true
	}
	pod, ok := x.pods[k]
	if !ok {
		delete(x.problems, "Pod "+k.String())
		x.setAddress(c, uid, nil)
		return
	}
	in := ambient.PodInput{Pod: pod, NodeLabels: x.nodeView(pod.Spec.NodeName)}
	for sk := range x.servicesByNamespace[k.namespace] {
		svc := x.services[sk]
		// Members: selected by the Service, or, for a selector-less
		// Service, pointed at by its EndpointSlices.
		if selects(svc.Spec.Selector, pod.Labels) || (len(svc.Spec.Selector) == 0 && x.slicePods[k][sk] && x.slicesPointAt(sk, pod)) {
			in.Services = append(in.Services, svc)
		}
	}
	sort.Slice(in.Services, func(i, j int) bool { return in.Services[i].Name < in.Services[j].Name })
	for sek := range x.serviceEntriesByNamespace[k.namespace] {
		if se := x.serviceEntries[sek]; entrySelects(se, pod.Labels) {
			in.ServiceEntries = append(in.ServiceEntries, se)
		}
	}
	sort.Slice(in.ServiceEntries, func(i, j int) bool { return in.ServiceEntries[i].Name < in.ServiceEntries[j].Name })
	in.Policies = x.selectingPolicies(k.namespace, pod.Labels)
	in.MTLSPolicy = ambient.MTLSPolicyKey(x.peerAuthsFor(k.namespace, pod.Labels), x.cfg)
	in.Waypoint = x.waypoint("Pod "+k.String(), k.namespace, pod.Labels, true)
	w := ambient.BuildPodWorkload(in, x.cfg)
	if w == nil {
		x.setAddress(c, uid, nil)
		return
	}
	x.setAddress(c, uid, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
}

// recomputeService rebuilds one Service's entry.
func (x *Index) recomputeService(c *change, k key) {
	name := workloadapi.ServiceKey(k.namespace, ambient.ServiceHostname(k.name, k.namespace, x.cfg))
	claim := ambient.Claim{Kind: ambient.KindService, Namespace: k.namespace, Name: k.name}
	owner := claim.Owner()
	x.dirtyPorts[k] = true
	svc, ok := x.services[k]
	if !ok {
		delete(x.problems, owner)
		x.publishService(c, name, serviceSource{claim: claim})
		return
	}
	in := ambient.ServiceInput{Service: svc, Waypoint: x.waypoint(owner, k.namespace, svc.Labels, false)}
	x.addProblem(owner, ambient.ServiceExport(svc, x.cfg).Warning)
	in.NamespaceLabels, in.NamespaceAnnotations = x.namespaceView(k.namespace)
	claim.Created = svc.CreationTimestamp.Time
	x.publishService(c, name, serviceSource{service: ambient.BuildService(in, x.cfg), claim: claim})
}

// addProblem adds msg, when not empty, to what is recorded of object.
func (x *Index) addProblem(object, msg string) {
	switch {
	case msg == "":
	case x.problems[object] == "":
		x.problems[object] = msg
	default:
		x.problems[object] += "; " + msg
	}
}

// waypoint resolves an object's waypoint binding, recording why a binding
// could not be used.
func (x *Index) waypoint(object, namespace string, lbls map[string]string, forWorkload bool) *workloadapi.GatewayAddress {
	delete(x.problems, object)
	nsLabels, _ := x.namespaceView(namespace)
	ref, ok := ambient.WaypointBinding(namespace, lbls, nsLabels)
	if !ok {
		return nil
	}
	gw := x.gateways[key{ref.Namespace, ref.Name}]
	if gw == nil {
		x.problems[object] = "waypoint " + ref.Namespace + "/" + ref.Name + " not found"
		return nil
	}
	addr, err := ambient.WaypointAddress(gw, nil, forWorkload, x.cfg)
	if err != nil {
		// A namespace-wide binding to a service-only waypoint is normal for
		// pods; only report what the object asked for itself.
		if lbls[ambient.LabelUseWaypoint] != "" {
			x.problems[object] = err.Error()
		}
		return nil
	}
	return addr
}
