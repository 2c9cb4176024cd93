package inject

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Policy is the injection policy for pods that neither ask for nor refuse a
// sidecar, like the policy key of Istio's injector configuration.
type Policy string

const (
	// PolicyEnabled injects every pod the namespace or pod selects, unless
	// the pod says sidecar.istio.io/inject=false. The zero Policy means
	// PolicyEnabled.
	PolicyEnabled Policy = "enabled"
	// PolicyDisabled injects only pods that say sidecar.istio.io/inject=true.
	PolicyDisabled Policy = "disabled"
)

// Config holds what the injector renders into pods. It is a value: build it
// once (cmd/ parses flags into it) and pass it down; nothing here changes it.
// Empty fields take the defaults documented on each.
type Config struct {
	// Hub and Tag name the proxy image, <Hub>/proxyv2:<Tag>, the image name
	// Istio publishes pilot-agent and Envoy under. Both are required unless
	// DenyReason is set.
	Hub string
	Tag string

	// DenyReason, when not empty, makes Handler deny every pod Required
	// selects, with this message, instead of injecting it: the webhook of
	// an installation that cannot inject (no proxy image configured) says
	// so to whoever creates such a pod, and leaves other pods alone.
	// Mutate and Inject ignore it.
	DenyReason string

	// DiscoveryAddress is host:port of canopy-controller's xDS over TLS,
	// normally its Service: "<name>.<namespace>.svc:15012". It becomes the
	// discoveryAddress of PROXY_CONFIG. Required.
	DiscoveryAddress string
	// CAAddress is CA_ADDR, where pilot-agent sends its CSRs. Default:
	// DiscoveryAddress (canopy-controller serves the CA on the same port).
	CAAddress string

	// TrustDomain is TRUST_DOMAIN. Default "cluster.local".
	TrustDomain string
	// ClusterID is ISTIO_META_CLUSTER_ID. Default "Kubernetes".
	ClusterID string
	// MeshID is ISTIO_META_MESH_ID. Default: the trust domain.
	MeshID string
	// Network is ISTIO_META_NETWORK and the pod label
	// topology.istio.io/network; both left out when empty. A pod's own
	// topology.istio.io/network label, when not empty, overrides it.
	Network string
	// ClusterDomain is the DNS suffix of Services. Default "cluster.local".
	ClusterDomain string

	// Revision is the control-plane revision this injector serves; empty is
	// the default revision, written as "default".
	Revision string
	// SystemNamespace is the namespace Canopy is installed in. Its pods are
	// never injected. Default "istio-system".
	SystemNamespace string
	// Policy applies to pods that neither ask for nor refuse a sidecar.
	Policy Policy
	// NeverInjectSelector and AlwaysInjectSelector decide, before Policy,
	// for selected pods that neither ask for nor refuse a sidecar: a pod
	// whose labels match one of NeverInjectSelector is not injected, else
	// one matching AlwaysInjectSelector is (the keys of Istio's injector
	// configuration of the same names).
	NeverInjectSelector, AlwaysInjectSelector []metav1.LabelSelector

	// CNI says a CNI plugin installs the pods' traffic redirection
	// (canopy-cni-agent's sidecar capture, or istio-cni). Pods then get the
	// unprivileged istio-validation init container instead of the
	// privileged istio-init, and the traffic.sidecar.istio.io/* annotations
	// the plugin reads.
	CNI bool
	// NativeSidecars puts istio-proxy among the init containers with
	// restartPolicy Always (Kubernetes native sidecars). A pod's
	// sidecar.istio.io/nativeSidecar annotation overrides it.
	NativeSidecars bool
	// HoldApplicationUntilProxyStarts starts istio-proxy first and holds the
	// other containers until it is ready (without native sidecars).
	HoldApplicationUntilProxyStarts bool
	// DisableAppProbeRewrite keeps the applications' HTTP, TCP and gRPC
	// probes as they are instead of sending them through pilot-agent's
	// status port. A pod's sidecar.istio.io/rewriteAppHTTPProbers
	// annotation overrides it.
	DisableAppProbeRewrite bool

	// ProxyResources are istio-proxy's requests and limits when the pod
	// sets none of the sidecar.istio.io/proxyCPU… annotations. Nil means
	// requests of 100m CPU and 128Mi memory and limits of 2 CPUs and 1Gi,
	// Istio's defaults; a non-nil empty value means none.
	ProxyResources *corev1.ResourceRequirements
	// ImagePullPolicy of the injected containers; left out when empty.
	ImagePullPolicy corev1.PullPolicy

	// ProxyLogLevel (default "warning"), ProxyComponentLogLevel (default
	// "misc:error") and AgentLogLevel (default "default:info") are the
	// defaults of the pod annotations sidecar.istio.io/logLevel,
	// componentLogLevel and agentLogLevel.
	ProxyLogLevel          string
	ProxyComponentLogLevel string
	AgentLogLevel          string
}

// Validate reports the first field of cfg that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Hub == "" && c.DenyReason == "" {
		errs = append(errs, errors.New("hub is empty"))
	}
	if c.Tag == "" && c.DenyReason == "" {
		errs = append(errs, errors.New("tag is empty"))
	}
	for _, f := range []struct{ name, v string }{{"hub", c.Hub}, {"tag", c.Tag}} {
		if strings.ContainsAny(f.v, " \t\r\n") {
			errs = append(errs, fmt.Errorf("%s %q holds white space", f.name, f.v))
		}
	}
	if c.DiscoveryAddress == "" {
		errs = append(errs, errors.New("discovery address is empty"))
	} else if !strings.Contains(c.DiscoveryAddress, ":") {
		errs = append(errs, fmt.Errorf("discovery address %q has no port", c.DiscoveryAddress))
	}
	switch c.Policy {
	case "", PolicyEnabled, PolicyDisabled:
	default:
		errs = append(errs, fmt.Errorf("policy %q is neither %q nor %q", c.Policy, PolicyEnabled, PolicyDisabled))
	}
	for _, set := range []struct {
		name string
		sels []metav1.LabelSelector
	}{{"neverInjectSelector", c.NeverInjectSelector}, {"alwaysInjectSelector", c.AlwaysInjectSelector}} {
		for i := range set.sels {
			if _, err := metav1.LabelSelectorAsSelector(&set.sels[i]); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", set.name, i, err))
			}
		}
	}
	if c.Revision != "" {
		if msgs := validation.IsValidLabelValue(c.Revision); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("revision %q: %s", c.Revision, strings.Join(msgs, "; ")))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid injector config: %w", err)
	}
	return nil
}

// withDefaults returns c with its empty fields set to their defaults.
func (c Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.CAAddress, c.DiscoveryAddress)
	def(&c.TrustDomain, "cluster.local")
	def(&c.ClusterID, "Kubernetes")
	def(&c.MeshID, c.TrustDomain)
	def(&c.ClusterDomain, "cluster.local")
	def(&c.SystemNamespace, "istio-system")
	def(&c.ProxyLogLevel, "warning")
	def(&c.ProxyComponentLogLevel, "misc:error")
	def(&c.AgentLogLevel, "default:info")
	if c.Policy == "" {
		c.Policy = PolicyEnabled
	}
	if c.ProxyResources == nil {
		c.ProxyResources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("100m"),
				corev1.ResourceMemory: resource.MustParse("128Mi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("2000m"),
				corev1.ResourceMemory: resource.MustParse("1024Mi"),
			},
		}
	}
	return c
}

// revisionName is the revision as written into pods and matched against
// istio.io/rev labels.
func (c Config) revisionName() string {
	if c.Revision == "" {
		return "default"
	}
	return c.Revision
}

// proxyImage is the proxyv2 image of hub and tag, with an image type
// ("distroless", "debug") as Istio names its variants: the tag gets
// "-<type>", replacing a known type it already ends with; "default" or
// empty means no suffix.
func proxyImage(hub, tag, imageType string) string {
	for _, known := range []string{"distroless", "debug"} {
		if t, ok := strings.CutSuffix(tag, "-"+known); ok && imageType != "" {
			tag = t
			break
		}
	}
	if imageType != "" && imageType != "default" {
		tag += "-" + imageType
	}
	return hub + "/proxyv2:" + tag
}
