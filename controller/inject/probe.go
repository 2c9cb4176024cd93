package inject

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// appProbersEnv is the variable through which pilot-agent learns the
// applications' original probes.
const appProbersEnv = "ISTIO_KUBE_APP_PROBERS"

// prober is one original probe as pilot-agent reads it from
// ISTIO_KUBE_APP_PROBERS.
type prober struct {
	HTTPGet        *corev1.HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *corev1.GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32                   `json:"timeoutSeconds,omitempty"`
}

// probePaths are pilot-agent's paths for a container's readiness,
// liveness and startup probes and its preStop and postStart hooks.
func probePaths(container string) (ready, live, startup, preStop, postStart string) {
	return "/app-health/" + container + "/readyz",
		"/app-health/" + container + "/livez",
		"/app-health/" + container + "/startupz",
		"/app-lifecycle/" + container + "/prestopz",
		"/app-lifecycle/" + container + "/poststartz"
}

// rewriteProbes sends the HTTP, TCP and gRPC probes and HTTP/TCP lifecycle
// hooks of every container but istio-proxy through pilot-agent's status
// port, as Istio's injector does: the kubelet's requests would otherwise
// be redirected into Envoy and fail mTLS. The originals go to istio-proxy
// in ISTIO_KUBE_APP_PROBERS, named ports resolved to numbers.
func rewriteProbes(pod *corev1.Pod, statusPort int32) error {
	probers := map[string]*prober{}
	rewrite := func(cs []corev1.Container) {
		for i := range cs {
			c := &cs[i]
			if c.Name == ProxyContainer {
				continue
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				if p.Name != "" {
					ports[p.Name] = p.ContainerPort
				}
			}
			ready, live, startup, preStop, postStart := probePaths(c.Name)
			probe := func(pr *corev1.Probe, path string) {
				if pr == nil {
					return
				}
				if orig := toProber(&pr.ProbeHandler, pr.TimeoutSeconds, ports, statusPort); orig != nil {
					probers[path] = orig
				}
				toStatusPort(&pr.ProbeHandler.HTTPGet, &pr.ProbeHandler.TCPSocket, &pr.ProbeHandler.GRPC, path, statusPort)
			}
			probe(c.ReadinessProbe, ready)
			probe(c.LivenessProbe, live)
			probe(c.StartupProbe, startup)
			if c.Lifecycle != nil {
				hook := func(h *corev1.LifecycleHandler, path string) {
					if h == nil {
						return
					}
					ph := corev1.ProbeHandler{HTTPGet: h.HTTPGet, TCPSocket: h.TCPSocket}
					if orig := toProber(&ph, 0, ports, statusPort); orig != nil {
						probers[path] = orig
					}
					var noGRPC *corev1.GRPCAction
					toStatusPort(&h.HTTPGet, &h.TCPSocket, &noGRPC, path, statusPort)
				}
				hook(c.Lifecycle.PreStop, preStop)
				hook(c.Lifecycle.PostStart, postStart)
			}
		}
	}
	rewrite(pod.Spec.InitContainers)
	rewrite(pod.Spec.Containers)
	if len(probers) == 0 {
		return nil
	}
	js, err := json.Marshal(probers) // map keys sorted: stable
	if err != nil {
		return fmt.Errorf("marshal app probers: %w", err)
	}
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == ProxyContainer {
				cs[i].Env = append(cs[i].Env, corev1.EnvVar{Name: appProbersEnv, Value: string(js)})
				return nil
			}
		}
	}
	return nil
}

// toProber is the original probe for pilot-agent, or nil when there is
// nothing for it to do (no HTTP/TCP/gRPC action, an unknown named port, or
// a probe already on the status port).
func toProber(h *corev1.ProbeHandler, timeout int32, ports map[string]int32, statusPort int32) *prober {
	if h.GRPC != nil {
		return &prober{GRPC: h.GRPC.DeepCopy(), TimeoutSeconds: timeout}
	}
	var p prober
	var port *intstr.IntOrString
	switch {
	case h.HTTPGet != nil:
		p.HTTPGet = h.HTTPGet.DeepCopy()
		port = &p.HTTPGet.Port
	case h.TCPSocket != nil:
		p.TCPSocket = h.TCPSocket.DeepCopy()
		port = &p.TCPSocket.Port
	default:
		return nil
	}
	p.TimeoutSeconds = timeout
	if port.Type == intstr.String {
		n, ok := ports[port.StrVal]
		if !ok {
			return nil
		}
		*port = intstr.FromInt32(n)
	} else if port.IntVal == statusPort {
		return nil
	}
	return &p
}

// toStatusPort turns an HTTP, TCP or gRPC action into an HTTP GET of path
// on the status port (HTTPS becomes HTTP: pilot-agent makes the HTTPS
// request to the application).
func toStatusPort(get **corev1.HTTPGetAction, tcp **corev1.TCPSocketAction, grpc **corev1.GRPCAction, path string, statusPort int32) {
	switch {
	case *get != nil:
		if (*get).Port.Type == intstr.Int && (*get).Port.IntVal == statusPort {
			return
		}
		(*get).Port = intstr.FromInt32(statusPort)
		(*get).Path = path
		if (*get).Scheme == corev1.URISchemeHTTPS {
			(*get).Scheme = corev1.URISchemeHTTP
		}
	case *tcp != nil, *grpc != nil:
		*get = &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(statusPort)}
		*tcp, *grpc = nil, nil
	}
}
