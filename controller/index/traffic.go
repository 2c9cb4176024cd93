package index

import (
	"maps"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/controller/sidecar"
)

// UpsertVirtualService stores a VirtualService.
func (x *Index) UpsertVirtualService(vs *networkingv1.VirtualService) ChangeSet {
	return setTraffic(x, &x.sidecar.virtualServices, key{vs.Namespace, vs.Name}, vs, "VirtualService", sidecar.VirtualServiceProblem)
}

// DeleteVirtualService forgets a VirtualService.
func (x *Index) DeleteVirtualService(namespace, name string) ChangeSet {
	return setTraffic(x, &x.sidecar.virtualServices, key{namespace, name}, nil, "VirtualService", sidecar.VirtualServiceProblem)
}

// UpsertDestinationRule stores a DestinationRule.
func (x *Index) UpsertDestinationRule(dr *networkingv1.DestinationRule) ChangeSet {
	return setTraffic(x, &x.sidecar.destinationRules, key{dr.Namespace, dr.Name}, dr, "DestinationRule", sidecar.DestinationRuleProblem)
}

// DeleteDestinationRule forgets a DestinationRule.
func (x *Index) DeleteDestinationRule(namespace, name string) ChangeSet {
	return setTraffic(x, &x.sidecar.destinationRules, key{namespace, name}, nil, "DestinationRule", sidecar.DestinationRuleProblem)
}

// UpsertSidecar stores a Sidecar resource. A Sidecar Istio's rules refuse
// is used as it is: it only narrows what a proxy sees. The fields Canopy
// does not translate are said.
func (x *Index) UpsertSidecar(sc *networkingv1.Sidecar) ChangeSet {
	return setTraffic(x, &x.sidecar.sidecars, key{sc.Namespace, sc.Name}, sc, "Sidecar", sidecar.SidecarProblem)
}

// DeleteSidecar forgets a Sidecar resource.
func (x *Index) DeleteSidecar(namespace, name string) ChangeSet {
	return setTraffic(x, &x.sidecar.sidecars, key{namespace, name}, nil, "Sidecar", sidecar.SidecarProblem)
}

// setTraffic stores obj under k in *objs (nil forgets it), under x's lock,
// with what sidecars do not get of it (problem, if not nil, says). Only
// sidecar xDS reads these.
func setTraffic[T any](x *Index, objs *map[key]*T, k key, obj *T, kind string, problem func(*T) string) ChangeSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	msg := ""
	if obj != nil && problem != nil {
		msg = problem(obj)
	}
	x.setConfigProblem(kind+" "+k.String(), msg)
	return ChangeSet{SidecarInputs: setObject(objs, k, obj)}
}

// setConfigProblem records (or, for "", forgets) what sidecars do not get
// of an object. The caller holds x.mu.
func (x *Index) setConfigProblem(object, msg string) {
	if msg == "" {
		delete(x.configProblems, object)
		return
	}
	if x.configProblems == nil {
		x.configProblems = map[string]string{}
	}
	x.configProblems[object] = msg
}

// ConfigProblems returns, by object ("<kind> <namespace>/<name>"), what
// sidecars do not get of a VirtualService, DestinationRule or
// ServiceEntry that Istio's rules refuse, in whole or in part, and why; the
// caller reports them as Events.
func (x *Index) ConfigProblems() map[string]string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return maps.Clone(x.configProblems)
}
