package ambient

import (
	"net/netip"
	"slices"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// PodInput is everything a pod's Workload depends on. The index gathers it;
// BuildPodWorkload only reads it.
type PodInput struct {
	Pod *corev1.Pod
	// NodeLabels are the labels of the pod's node, for locality; empty
	// when the node is unknown.
	NodeLabels Labels
	// Services are the Services the pod backs: in its namespace, selecting
	// it, or selector-less with an EndpointSlice that targets it.
	Services []*corev1.Service
	// ServiceEntries select the pod by their workloadSelector.
	ServiceEntries []*networkingv1.ServiceEntry
	// Policies are the keys ("<namespace>/<name>") of the selector-bound
	// authorization policies that select the pod.
	Policies []string
	// MTLSPolicy is the key of the Authorization that enforces the pod's
	// PeerAuthentication mode (MTLSPolicyKey), or empty.
	MTLSPolicy string
	// Waypoint is the pod's resolved workload waypoint, or nil.
	Waypoint *workloadapi.GatewayAddress
}

// BuildPodWorkload returns the Workload of a pod, or nil when the pod is not
// sent: it has finished (Succeeded or Failed) or has no IP yet. Every other
// pod is sent, ambient or not (wire contract §7.1).
func BuildPodWorkload(in PodInput, cfg Config) *workloadapi.Workload {
	cfg = cfg.WithDefaults()
	pod := in.Pod
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	addrs := podAddresses(pod)
	if len(addrs) == 0 {
		return nil
	}
	w := &workloadapi.Workload{
		Uid:                   workloadapi.PodUID(cfg.ClusterID, pod.Namespace, pod.Name),
		Name:                  pod.Name,
		Namespace:             pod.Namespace,
		Addresses:             addrs,
		Network:               cfg.Network,
		ServiceAccount:        pod.Spec.ServiceAccountName,
		Node:                  pod.Spec.NodeName,
		WorkloadType:          workloadapi.WorkloadType_POD,
		WorkloadName:          podWorkloadName(pod),
		ClusterId:             cfg.ClusterID,
		Status:                podStatus(pod),
		Locality:              nodeLocality(in.NodeLabels),
		AuthorizationPolicies: workloadPolicies(in.Policies, in.MTLSPolicy),
		Services:              podServices(pod, in.Services, cfg),
	}
	for _, se := range in.ServiceEntries {
		if w.Services == nil {
			w.Services = map[string]*workloadapi.PortList{}
		}
		for _, host := range se.Spec.GetHosts() {
			w.Services[workloadapi.ServiceKey(se.Namespace, host)] = entryPodPorts(se, pod)
		}
	}
	if cfg.TrustDomain != workloadapi.DefaultTrustDomain {
		w.TrustDomain = cfg.TrustDomain
	}
	w.CanonicalName, w.CanonicalRevision = CanonicalNames(pod.Labels, w.WorkloadName)
	w.TunnelProtocol, w.NativeTunnel = tunnel(pod)
	if pod.Spec.HostNetwork {
		w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK
	}
	if !isWaypoint(pod.Labels) {
		w.Waypoint = in.Waypoint
	}
	return w
}

// podAddresses returns the pod's IPs as raw bytes, from status.podIPs, or
// status.podIP on servers that do not fill podIPs.
func podAddresses(pod *corev1.Pod) [][]byte {
	ips := make([]string, 0, 2)
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = append(ips, pod.Status.PodIP)
	}
	var out [][]byte
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap().AsSlice())
		}
	}
	return out
}

// tunnel decides how node proxies reach the pod: HBONE once the CNI agent
// has enrolled it, or when it terminates HBONE itself (a sidecar or a
// waypoint; then native_tunnel too).
func tunnel(pod *corev1.Pod) (workloadapi.TunnelProtocol, bool) {
	if slices.Contains(strings.Split(pod.Labels[LabelTunnel], ","), "http") {
		return workloadapi.TunnelProtocol_HBONE, true
	}
	if pod.Annotations[AnnotationRedirection] == "enabled" {
		return workloadapi.TunnelProtocol_HBONE, false
	}
	return workloadapi.TunnelProtocol_NONE, false
}

// podStatus is HEALTHY for a Ready pod that is not being deleted.
func podStatus(pod *corev1.Pod) workloadapi.WorkloadStatus {
	if pod.DeletionTimestamp != nil {
		return workloadapi.WorkloadStatus_UNHEALTHY
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return workloadapi.WorkloadStatus_HEALTHY
		}
	}
	return workloadapi.WorkloadStatus_UNHEALTHY
}

func nodeLocality(node Labels) *workloadapi.Locality {
	l := &workloadapi.Locality{
		Region:  node.Get(corev1.LabelTopologyRegion),
		Zone:    node.Get(corev1.LabelTopologyZone),
		Subzone: node.Get(LabelSubzone),
	}
	if l.Region == "" && l.Zone == "" && l.Subzone == "" {
		return nil
	}
	return l
}

// podServices builds Workload.services: for each Service the pod backs, its
// ports mapped to this pod's target ports. A named target port resolves
// against the pod's container ports; a port the pod does not have is left out
// for this pod (wire contract §7.2).
func podServices(pod *corev1.Pod, services []*corev1.Service, cfg Config) map[string]*workloadapi.PortList {
	out := map[string]*workloadapi.PortList{}
	for _, svc := range services {
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		pl := &workloadapi.PortList{}
		for _, sp := range svc.Spec.Ports {
			target, ok := resolveTargetPort(sp, pod)
			if !ok {
				continue
			}
			pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(sp.Port), TargetPort: target})
		}
		out[workloadapi.ServiceKey(svc.Namespace, ServiceHostname(svc.Name, svc.Namespace, cfg))] = pl
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// entryPodPorts maps a ServiceEntry's ports onto a pod it selects
// (wire contract §7.2): the container port named like the ServiceEntry port,
// else the port's target port, else the service port.
func entryPodPorts(se *networkingv1.ServiceEntry, pod *corev1.Pod) *workloadapi.PortList {
	named := map[string]uint32{}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name != "" {
				named[cp.Name] = uint32(cp.ContainerPort)
			}
		}
	}
	return entryPorts(se.Spec.GetPorts(), named)
}

// resolveTargetPort finds a service port's target on a pod.
func resolveTargetPort(sp corev1.ServicePort, pod *corev1.Pod) (uint32, bool) {
	switch {
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal && protocolOf(cp.Protocol) == protocolOf(sp.Protocol) {
					return uint32(cp.ContainerPort), true
				}
			}
		}
		return 0, false
	case sp.TargetPort.IntVal != 0:
		return uint32(sp.TargetPort.IntVal), true
	default:
		// An unset target port means the service port.
		return uint32(sp.Port), true
	}
}

func protocolOf(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// isWaypoint reports a waypoint's (or east-west gateway's) own resources.
func isWaypoint(labels map[string]string) bool {
	return labels[LabelManagedGateway] == ManagedByMesh
}

func sortedCopy(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
