package ambient

import (
	"net/netip"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// WorkloadEntryInput is everything a WorkloadEntry's Workload depends on.
type WorkloadEntryInput struct {
	WorkloadEntry *networkingv1.WorkloadEntry
	// Services are the Kubernetes Services of its namespace whose selector
	// matches it.
	Services []*corev1.Service
	// ServiceEntries select the entry by their workloadSelector.
	ServiceEntries []*networkingv1.ServiceEntry
	// Policies are the keys of the selector-bound policies selecting it;
	// an entry without labels is selected by every one in scope.
	Policies []string
	// MTLSPolicy is the key of the Authorization that enforces its
	// PeerAuthentication mode, or empty.
	MTLSPolicy string
	Waypoint   *workloadapi.GatewayAddress
}

// WorkloadEntryLabels are a WorkloadEntry's labels, as Istio reads them
// (ConvertClientWorkloadEntry in pilot/pkg/serviceregistry/serviceentry):
// its spec's and its object's, the object's winning. Selectors match them.
func WorkloadEntryLabels(we *networkingv1.WorkloadEntry) map[string]string {
	spec := we.Spec.GetLabels()
	if spec == nil {
		return we.Labels
	}
	out := make(map[string]string, len(spec)+len(we.Labels))
	for k, v := range spec {
		out[k] = v
	}
	for k, v := range we.Labels {
		out[k] = v
	}
	return out
}

// BuildWorkloadEntry returns the Workload of a WorkloadEntry (a VM or other
// workload outside Kubernetes).
func BuildWorkloadEntry(in WorkloadEntryInput, cfg Config) *workloadapi.Workload {
	cfg = cfg.WithDefaults()
	we := in.WorkloadEntry
	labels := WorkloadEntryLabels(we)
	w := entryWorkload(&we.Spec, we.Namespace, labels, entryWorkloadName(we.ObjectMeta, labels), cfg)
	w.Uid = workloadapi.WorkloadEntryUID(cfg.ClusterID, we.Namespace, we.Name)
	w.Name = we.Name
	w.AuthorizationPolicies = workloadPolicies(in.Policies, in.MTLSPolicy)
	if !isWaypoint(we.Labels) {
		w.Waypoint = in.Waypoint
	}
	for _, svc := range in.Services {
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if w.Services == nil {
			w.Services = map[string]*workloadapi.PortList{}
		}
		w.Services[workloadapi.ServiceKey(svc.Namespace, ServiceHostname(svc.Name, svc.Namespace, cfg))] = entryServicePorts(svc, we.Spec.GetPorts())
	}
	for _, se := range in.ServiceEntries {
		if w.Services == nil {
			w.Services = map[string]*workloadapi.PortList{}
		}
		for _, host := range se.Spec.GetHosts() {
			w.Services[workloadapi.ServiceKey(se.Namespace, host)] = entryPorts(se.Spec.GetPorts(), we.Spec.GetPorts())
		}
	}
	return w
}

// entryServicePorts maps a Kubernetes Service's ports onto a WorkloadEntry
// it selects, as istiod does (constructServicesFromWorkloadEntry in
// pilot/pkg/serviceregistry/ambient/workloads.go): a named target port is
// the entry's port of that name, and the port is left out when the entry
// has none; any other port is the entry's port named like the Service port,
// else the numeric target port (else the service port).
func entryServicePorts(svc *corev1.Service, endpointPorts map[string]uint32) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for _, sp := range svc.Spec.Ports {
		var target uint32
		if sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "" {
			p, ok := endpointPorts[sp.TargetPort.StrVal]
			if !ok {
				continue
			}
			target = p
		} else if p, ok := endpointPorts[sp.Name]; ok {
			target = p
		} else {
			target = uint32(sp.TargetPort.IntVal)
		}
		if target == 0 {
			target = uint32(sp.Port)
		}
		pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(sp.Port), TargetPort: target})
	}
	return pl
}

// entryWorkload fills what a WorkloadEntry (inline in a ServiceEntry or on
// its own) says about a workload; labels are the workload's (for its tunnel
// and canonical names).
func entryWorkload(we *networkingapi.WorkloadEntry, namespace string, labels map[string]string, workloadName string, cfg Config) *workloadapi.Workload {
	w := &workloadapi.Workload{
		Namespace:      namespace,
		Network:        cfg.Network,
		ServiceAccount: we.GetServiceAccount(),
		WorkloadType:   workloadapi.WorkloadType_POD,
		WorkloadName:   workloadName,
		ClusterId:      cfg.ClusterID,
		Locality:       parseLocality(we.GetLocality()),
	}
	if we.GetNetwork() != "" {
		w.Network = we.GetNetwork()
	}
	if a, err := netip.ParseAddr(we.GetAddress()); err == nil {
		w.Addresses = [][]byte{a.Unmap().AsSlice()}
	} else {
		w.Hostname = we.GetAddress()
	}
	if cfg.TrustDomain != workloadapi.DefaultTrustDomain {
		w.TrustDomain = cfg.TrustDomain
	}
	if we.GetWeight() > 0 {
		w.Capacity = wrapperspb.UInt32(we.GetWeight())
	}
	if strings.Contains(","+labels[LabelTunnel]+",", ",http,") {
		w.TunnelProtocol, w.NativeTunnel = workloadapi.TunnelProtocol_HBONE, true
	}
	w.CanonicalName, w.CanonicalRevision = CanonicalNames(labels, workloadName)
	return w
}

// parseLocality reads "region/zone/subzone" (any suffix may be missing).
func parseLocality(s string) *workloadapi.Locality {
	if s == "" {
		return nil
	}
	parts := strings.SplitN(s, "/", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return &workloadapi.Locality{Region: parts[0], Zone: parts[1], Subzone: parts[2]}
}
