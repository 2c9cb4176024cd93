package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// Output is a table format: "" (the default table), "wide", "json" or
// "yaml".
type Output string

// ParseOutput checks an -o value.
func ParseOutput(s string) (Output, error) {
	switch s {
	case "", "wide", "json", "yaml":
		return Output(s), nil
	}
	return "", fmt.Errorf("unknown output format %q: use wide, json or yaml", s)
}

// ProxyOptions choose the node proxy whose view is read.
type ProxyOptions struct {
	// Namespace is where Canopy runs.
	Namespace string
	// Proxy names a canopy-node pod; empty means any ready one.
	Proxy string
}

// WorkloadsOptions are canopyctl workloads' flags.
type WorkloadsOptions struct {
	ProxyOptions
	Filter view.WorkloadFilter
	Output Output
}

// Workloads lists the mesh's workloads as a node proxy holds them.
func Workloads(ctx context.Context, c *cluster.Cluster, opts WorkloadsOptions, w io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	ws := view.FilterWorkloads(dump.Workloads, opts.Filter)
	switch opts.Output {
	case "json", "yaml":
		return printData(w, opts.Output, ws)
	}
	return view.WorkloadsTable(ws, dump.Services, opts.Output == "wide").Print(w)
}

// ListOptions are the flags of services and policies.
type ListOptions struct {
	ProxyOptions
	// Filter is a namespace; empty lists all.
	Filter string
	Output Output
}

// Services lists the mesh's services with their endpoints' health.
func Services(ctx context.Context, c *cluster.Cluster, opts ListOptions, w io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	if opts.Output == "json" || opts.Output == "yaml" {
		return printData(w, opts.Output, dump.Services)
	}
	return view.ServicesTable(dump.Services, opts.Filter).Print(w)
}

// Policies lists the authorization policies node proxies enforce.
func Policies(ctx context.Context, c *cluster.Cluster, opts ListOptions, w io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	if opts.Output == "json" || opts.Output == "yaml" {
		return printData(w, opts.Output, dump.Policies)
	}
	return view.PoliciesTable(dump.Policies, opts.Filter).Print(w)
}

// CertificatesOptions are canopyctl certificates' flags.
type CertificatesOptions struct {
	Namespace string
	// Node keeps one node's proxy; empty means every node.
	Node   string
	Output Output
}

// Certificates lists every node proxy's workload certificates with their
// expiry.
func Certificates(ctx context.Context, c *cluster.Cluster, opts CertificatesOptions, w io.Writer) error {
	pods, err := nodeProxies(ctx, c, opts.Namespace, opts.Node, opts.Output, w)
	if err != nil {
		return err
	}
	var nodes []view.NodeCertificates
	for _, p := range pods {
		dump, err := fetchDump(ctx, c, p)
		if err != nil {
			return err
		}
		nodes = append(nodes, view.NodeCertificates{Node: p.Spec.NodeName, Proxy: p.Name, Certs: dump.Certificates})
	}
	if opts.Output == "json" || opts.Output == "yaml" {
		return printData(w, opts.Output, nodes)
	}
	return view.CertificatesTable(nodes, time.Now()).Print(w)
}

// ProxyStatusOptions are canopyctl proxy-status' flags.
type ProxyStatusOptions struct {
	Namespace string
	Verbose   bool
	Output    Output
}

// ProxyStatus shows, from every controller instance, the proxies it
// serves and whether each has acknowledged what it was sent.
func ProxyStatus(ctx context.Context, c *cluster.Cluster, opts ProxyStatusOptions, w io.Writer) error {
	pods, err := c.Pods(ctx, opts.Namespace, cluster.ControllerApp)
	if err != nil {
		return err
	}
	var all []view.ControllerStatus
	for i := range pods {
		p := &pods[i]
		if !cluster.Ready(p) {
			continue
		}
		body, err := c.Get(ctx, p, cluster.DebugPort, "/debug/syncz")
		if err != nil {
			return err
		}
		cs := view.ControllerStatus{Controller: p.Name}
		if err := json.Unmarshal(body, &cs.Proxies); err != nil {
			return fmt.Errorf("proxy status of %s: %w", p.Name, err)
		}
		all = append(all, cs)
	}
	if len(all) == 0 {
		return fmt.Errorf("no ready canopy-controller pod in namespace %s: see kubectl -n %s get pods", opts.Namespace, opts.Namespace)
	}
	if opts.Output == "json" || opts.Output == "yaml" {
		return printData(w, opts.Output, all)
	}
	return view.ProxyStatusTable(all, opts.Verbose, time.Now()).Print(w)
}

// ConfigDumpOptions are canopyctl config-dump's flags.
type ConfigDumpOptions struct {
	Namespace string
	// Target is "controller" or "node".
	Target string
	// Pod names the pod; empty means a ready one (for node: on Node).
	Pod, Node string
	// ProxyID, for the controller, shows what it sent that proxy instead
	// of its tables.
	ProxyID string
}

// ConfigDump prints a component's full configuration as JSON: a node
// proxy's /config_dump, the controller's tables, or what the controller
// sent one proxy.
func ConfigDump(ctx context.Context, c *cluster.Cluster, opts ConfigDumpOptions, w io.Writer) error {
	var (
		pod  *corev1.Pod
		port int
		path string
		err  error
	)
	switch opts.Target {
	case "node":
		port, path = cluster.NodeAdminPort, "/config_dump"
		pod, err = pickPod(ctx, c, opts.Namespace, cluster.NodeProxyApp, opts.Pod, opts.Node)
	case "controller":
		port, path = cluster.DebugPort, "/debug/tables"
		if opts.ProxyID != "" {
			path = "/debug/config_dump?" + url.Values{"proxyID": {opts.ProxyID}}.Encode()
		}
		pod, err = pickPod(ctx, c, opts.Namespace, cluster.ControllerApp, opts.Pod, "")
	default:
		return fmt.Errorf("config-dump of %q: use controller or node", opts.Target)
	}
	if err != nil {
		return err
	}
	body, err := c.Get(ctx, pod, port, path)
	if err != nil {
		return err
	}
	_, err = w.Write(body)
	return err
}

// nodeProxies are the ready node proxies (on node, if set). Those not
// ready are skipped, and said so in table output (JSON and YAML stay
// parseable).
func nodeProxies(ctx context.Context, c *cluster.Cluster, namespace, node string, o Output, w io.Writer) ([]*corev1.Pod, error) {
	pods, err := c.Pods(ctx, namespace, cluster.NodeProxyApp)
	if err != nil {
		return nil, err
	}
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		switch {
		case node != "" && p.Spec.NodeName != node:
		case !cluster.Ready(p):
			if o != "json" && o != "yaml" {
				fmt.Fprintf(w, "# %s on %s is not ready; skipped\n", p.Name, p.Spec.NodeName)
			}
		default:
			out = append(out, p)
		}
	}
	if node != "" && len(out) == 0 {
		return nil, fmt.Errorf("no ready canopy-node pod on node %s", node)
	}
	return out, nil
}

func nodeDump(ctx context.Context, c *cluster.Cluster, opts ProxyOptions) (*configdump.Dump, error) {
	pod, err := pickPod(ctx, c, opts.Namespace, cluster.NodeProxyApp, opts.Proxy, "")
	if err != nil {
		return nil, err
	}
	return fetchDump(ctx, c, pod)
}

func fetchDump(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) (*configdump.Dump, error) {
	body, err := c.Get(ctx, pod, cluster.NodeAdminPort, "/config_dump")
	if err != nil {
		return nil, err
	}
	var d configdump.Dump
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("config_dump of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return &d, nil
}

// pickPod is the named pod, else a ready pod of app (on node, if given).
func pickPod(ctx context.Context, c *cluster.Cluster, namespace, app, name, node string) (*corev1.Pod, error) {
	if name != "" {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		return p, nil
	}
	if node == "" {
		return c.ReadyPod(ctx, namespace, app)
	}
	pods, err := c.Pods(ctx, namespace, app)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Spec.NodeName == node && cluster.Ready(&pods[i]) {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("no ready %s pod on node %s", app, node)
}

func printData(w io.Writer, o Output, v any) error {
	if o == "yaml" {
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// TrafficOptions are canopyctl traffic's flags.
type TrafficOptions struct {
	Namespace string
	Node      string
	Output    Output
}

// Traffic shows the connections node proxies have carried, by source and
// destination workload, identities and security: whether traffic went
// over mutual TLS between the identities it should.
func Traffic(ctx context.Context, c *cluster.Cluster, opts TrafficOptions, w io.Writer) error {
	pods, err := nodeProxies(ctx, c, opts.Namespace, opts.Node, opts.Output, w)
	if err != nil {
		return err
	}
	var all []view.Connection
	for _, p := range pods {
		body, err := c.Get(ctx, p, cluster.NodeMetricsPort, "/metrics")
		if err != nil {
			return err
		}
		cs, err := view.ParseConnections(p.Spec.NodeName, bytes.NewReader(body))
		if err != nil {
			return err
		}
		all = append(all, cs...)
	}
	if opts.Output == "json" || opts.Output == "yaml" {
		return printData(w, opts.Output, all)
	}
	return view.TrafficTable(all).Print(w)
}
