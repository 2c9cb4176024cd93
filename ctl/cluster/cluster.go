// Package cluster is how canopyctl reaches a cluster: the kubeconfig and
// context a user chose, Canopy's pods found by label, and their ports
// reached the way kubectl port-forward does (through the API server and
// the kubelet), so that loopback-only admin ports work and nothing but the
// API server needs to be reachable.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// ComponentLabel is the pod label whose value names a Canopy component
// (ControllerApp, NodeProxyApp, CNIAgentApp). Pods are found by it, not
// by "app", which the chart sets to the Istio component each replaces
// (istiod, ztunnel) so that istioctl finds them.
const ComponentLabel = "app.kubernetes.io/name"

// Selector selects the pods of a component.
func Selector(component string) string { return ComponentLabel + "=" + component }

// Well-known components and ports of Canopy's components.
const (
	ControllerApp          = "canopy-controller"
	NodeProxyApp           = "canopy-node"
	CNIAgentApp            = "canopy-cni-agent"
	MonitoringPort         = 15014 // the controller's health, metrics and version
	DebugPort              = 15015 // the controller's debug views, loopback only
	NodeAdminPort          = 15000 // the node proxy's config_dump, loopback only
	NodeMetricsPort        = 15020 // the node proxy's Prometheus metrics
	CNIAgentMonitoringPort = 15024 // the CNI agent's metrics, health and version
)

// Cluster is a connection to one cluster.
type Cluster struct {
	Config *rest.Config
	Client kubernetes.Interface
}

// ContextNotFoundError is a context the kubeconfig does not have: the one
// --context named, or else its current-context.
type ContextNotFoundError struct {
	// Name is the missing context.
	Name string
	// Current is set when Name is the kubeconfig's current-context
	// rather than a --context.
	Current bool
	// Kubeconfig names the files read, as the user gave or defaulted them.
	Kubeconfig string
	// Contexts are the kubeconfig's contexts, sorted.
	Contexts []string
}

func (e *ContextNotFoundError) Error() string {
	what := fmt.Sprintf("context %q does not exist in the kubeconfig (%s)", e.Name, e.Kubeconfig)
	if e.Current {
		what = fmt.Sprintf("the current context %q of the kubeconfig (%s) does not exist", e.Name, e.Kubeconfig)
	}
	if len(e.Contexts) == 0 {
		return what + ", which has no contexts: check --kubeconfig or KUBECONFIG"
	}
	return fmt.Sprintf("%s; its contexts are %s: pass one with --context", what, strings.Join(e.Contexts, ", "))
}

// probeTimeout bounds Connect's first request.
const probeTimeout = 10 * time.Second

// Connect loads kubeconfig (empty: $KUBECONFIG, else ~/.kube/config) with
// the named context (empty: the current one), and asks the API server for
// its version, so that a cluster that cannot be reached fails here, with
// an error that says so, before a command has done or printed anything.
func Connect(ctx context.Context, kubeconfig, kubeContext string) (*Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	files := kubeconfig
	if files == "" {
		files = strings.Join(rules.GetLoadingPrecedence(), string(filepath.ListSeparator))
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	raw, err := loader.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w; check --kubeconfig or KUBECONFIG", files, err)
	}
	// Checked here, on the loaded contexts, rather than recognised in
	// ClientConfig's error: clientcmd's context-not-found type is
	// unexported and arrives inside an aggregate.
	if name := cmp.Or(kubeContext, raw.CurrentContext); name != "" {
		if _, ok := raw.Contexts[name]; !ok {
			return nil, &ContextNotFoundError{Name: name, Current: kubeContext == "", Kubeconfig: files, Contexts: slices.Sorted(maps.Keys(raw.Contexts))}
		}
	}
	cfg, err := loader.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errors.New("no kubeconfig found: set --kubeconfig or KUBECONFIG (for the local cluster: /var/lib/canopy-local/<name>/control-plane/admin.kubeconfig)")
	}
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w; check --kubeconfig or KUBECONFIG", files, err)
	}
	cfg.UserAgent = "canopyctl"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c := &Cluster{Config: cfg, Client: client}
	if err := c.probe(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// probe asks the API server for its version.
func (c *Cluster) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err := c.Client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return nil
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server at %s does not accept the kubeconfig's credentials: %w; log in again, or check --kubeconfig/--context", c.Config.Host, err)
	case errors.As(err, &status):
		return fmt.Errorf("ask the API server at %s for its version: %w", c.Config.Host, err)
	}
	return fmt.Errorf("cannot reach the API server at %s: %w; is the cluster running? check --kubeconfig/--context", c.Config.Host, err)
}

// Pods lists the pods of a component (its ComponentLabel) in namespace,
// ready ones first, then by name. No pod is an error that says what to do.
func (c *Cluster) Pods(ctx context.Context, namespace, app string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector(app)})
	if err != nil {
		return nil, fmt.Errorf("list %s pods in namespace %s: %w", app, namespace, err)
	}
	if len(list.Items) == 0 {
		return nil, NoPods(namespace, app)
	}
	pods := list.Items
	slices.SortFunc(pods, func(a, b corev1.Pod) int {
		if ra, rb := Ready(&a), Ready(&b); ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return pods, nil
}

// NoPods is Pods' error when a component has no pod in namespace: Canopy
// is not installed there.
func NoPods(namespace, app string) error {
	return fmt.Errorf("no %s pod in namespace %s: run canopyctl install, or pass -i/--istio-namespace", app, namespace)
}

// Pod gets one pod.
func (c *Cluster) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

// InjectedPods lists, in every namespace, the pods the sidecar injector
// changed: it labels each with its canonical name (the label selects them
// on the server), and annotates it with its sidecar's status.
func (c *Cluster) InjectedPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "service.istio.io/canonical-name"})
	if err != nil {
		return nil, fmt.Errorf("list pods with sidecars: %w", err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Annotations["sidecar.istio.io/status"] != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// Ready reports the pod's Ready condition; a terminating pod is not
// ready, whatever its last probe said.
func Ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Get fetches path from port of a pod through a port-forward and returns
// the body of a 200 response.
func (c *Cluster) Get(ctx context.Context, pod *corev1.Pod, port int, path string) ([]byte, error) {
	local, stop, err := c.forward(ctx, pod, port)
	if err != nil {
		return nil, err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+local+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s of %s/%s:%d: %w", path, pod.Namespace, pod.Name, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s of %s/%s: %w", path, pod.Namespace, pod.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s of %s/%s:%d: %s: %s", path, pod.Namespace, pod.Name, port, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// forward opens a port-forward to the pod's port on an ephemeral local
// port and returns its address and how to close it.
func (c *Cluster) forward(ctx context.Context, pod *corev1.Pod, port int) (string, func(), error) {
	transport, upgrader, err := spdy.RoundTripperFor(c.Config)
	if err != nil {
		return "", nil, fmt.Errorf("port-forward transport: %w", err)
	}
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return "", nil, fmt.Errorf("API server URL: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", pod.Namespace, pod.Name)
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", nil, fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	closeFw := func() { close(stop); <-done }
	select {
	case <-ready:
	case err := <-done:
		if err == nil {
			err = errors.New("closed before it was ready")
		}
		return "", nil, fmt.Errorf("port-forward to %s/%s:%d: %w", pod.Namespace, pod.Name, port, err)
	case <-ctx.Done():
		closeFw()
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err == nil && len(ports) == 0 {
		err = errors.New("no local port")
	}
	if err != nil {
		closeFw()
		return "", nil, fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), closeFw, nil
}
