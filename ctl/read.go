package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// PodReader is what the read commands need of a cluster: Canopy's pods
// and what their ports serve. *cluster.Cluster implements it; tests use a
// fake. Implementations must be safe for concurrent use (Version asks
// pods in parallel).
type PodReader interface {
	// Pods lists a component's pods (by its app label) in namespace,
	// ready ones first, then by name; no pod is an error that says what
	// to do.
	Pods(ctx context.Context, namespace, app string) ([]corev1.Pod, error)
	// Pod gets one pod.
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// Get returns the body of a 200 response to GET path on the pod's
	// port.
	Get(ctx context.Context, pod *corev1.Pod, port int, path string) ([]byte, error)
	// InjectedPods lists the pods of every namespace that the sidecar
	// injector changed.
	InjectedPods(ctx context.Context) ([]corev1.Pod, error)
}

// Output is an -o format; the zero value is the default table.
type Output string

// The -o formats. Each command accepts the table and those it documents.
const (
	Table Output = ""
	Wide  Output = "wide"
	JSON  Output = "json"
	YAML  Output = "yaml"
)

// data reports a machine-readable format: printed whole, empty or not,
// and never mixed with notes for people.
func (o Output) data() bool { return o == JSON || o == YAML }

// ParseOutput checks an -o value against the formats a command accepts;
// the table (no -o) is always accepted.
func ParseOutput(s string, accepted []Output) (Output, error) {
	if o := Output(s); o == Table || slices.Contains(accepted, o) {
		return o, nil
	}
	return "", fmt.Errorf("unknown output format %q: use %s, or no -o for the table", s, FormatNames(accepted))
}

// FormatNames lists formats as help text does: "wide, json or yaml".
func FormatNames(formats []Output) string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = string(f)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// noResources tells, as kubectl does and on errOut, that a listing found
// nothing: "No resources found in demo namespace."
func noResources(errOut io.Writer, namespace, node string) {
	msg := "No resources found"
	if namespace != "" {
		msg += " in " + namespace + " namespace"
	}
	if node != "" {
		msg += " on node " + node
	}
	fmt.Fprintln(errOut, msg+".")
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

// WorkloadsFormats are the -o formats of Workloads.
func WorkloadsFormats() []Output { return []Output{Wide, JSON, YAML} }

// ListFormats are the -o formats of the other read commands.
func ListFormats() []Output { return []Output{JSON, YAML} }

// Workloads lists the mesh's workloads as a node proxy holds them. When
// none matches, the table says so on errOut instead of printing a bare
// header.
func Workloads(ctx context.Context, c PodReader, opts WorkloadsOptions, out, errOut io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	ws := view.FilterWorkloads(dump.Workloads, opts.Filter)
	switch {
	case opts.Output.data():
		return printData(out, opts.Output, ws)
	case len(ws) == 0:
		noResources(errOut, opts.Filter.Namespace, opts.Filter.Node)
		return nil
	}
	// Without the right to list pods everywhere the table is still the
	// node proxy's: say what is missing rather than fail.
	injected, err := c.InjectedPods(ctx)
	if err != nil {
		fmt.Fprintf(errOut, "canopyctl: PROTOCOL does not mark pods with sidecars: %v\n", err)
	}
	return view.WorkloadsTable(ws, dump.Services, dataplanes(injected), opts.Output == Wide).Print(out)
}

// dataplanes says, by "namespace/name", which pods run a sidecar: Istio's
// workload table holds no such field (a sidecar pod's traffic is plain TCP
// to the node proxies), so canopyctl reads it from the pods.
func dataplanes(pods []corev1.Pod) map[string]string {
	m := map[string]string{}
	for i := range pods {
		if d := view.Dataplane(&pods[i]); d != "" {
			m[pods[i].Namespace+"/"+pods[i].Name] = d
		}
	}
	return m
}

// ListOptions are the flags of services and policies.
type ListOptions struct {
	ProxyOptions
	// Filter is a namespace; empty lists all.
	Filter string
	Output Output
}

// Services lists the mesh's services with their endpoints' health.
func Services(ctx context.Context, c PodReader, opts ListOptions, out, errOut io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	ss := view.FilterServices(dump.Services, opts.Filter)
	switch {
	case opts.Output.data():
		return printData(out, opts.Output, ss)
	case len(ss) == 0:
		noResources(errOut, opts.Filter, "")
		return nil
	}
	return view.ServicesTable(dump.Services, opts.Filter).Print(out)
}

// Policies lists the authorization policies node proxies enforce.
func Policies(ctx context.Context, c PodReader, opts ListOptions, out, errOut io.Writer) error {
	dump, err := nodeDump(ctx, c, opts.ProxyOptions)
	if err != nil {
		return err
	}
	ps := view.FilterPolicies(dump.Policies, opts.Filter)
	switch {
	case opts.Output.data():
		return printData(out, opts.Output, ps)
	case len(ps) == 0:
		noResources(errOut, opts.Filter, "")
		return nil
	}
	return view.PoliciesTable(ps, "").Print(out)
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
func Certificates(ctx context.Context, c PodReader, opts CertificatesOptions, out, errOut io.Writer) error {
	pods, err := nodeProxies(ctx, c, opts.Namespace, opts.Node, errOut)
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
	if opts.Output.data() {
		return printData(out, opts.Output, nodes)
	}
	return view.CertificatesTable(nodes, time.Now()).Print(out)
}

// ProxyStatusOptions are canopyctl proxy-status' flags.
type ProxyStatusOptions struct {
	Namespace string
	Verbose   bool
	Output    Output
}

// ProxyStatus shows, from every controller instance, the proxies it
// serves and whether each has acknowledged what it was sent.
func ProxyStatus(ctx context.Context, c PodReader, opts ProxyStatusOptions, out io.Writer) error {
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
			return fmt.Errorf("decode the proxy status of %s: %w", p.Name, err)
		}
		all = append(all, cs)
	}
	if len(all) == 0 {
		return fmt.Errorf("no ready canopy-controller pod in namespace %s: see kubectl -n %s describe pods -l %s", opts.Namespace, opts.Namespace, cluster.Selector(cluster.ControllerApp))
	}
	if opts.Output.data() {
		return printData(out, opts.Output, all)
	}
	return view.ProxyStatusTable(all, opts.Verbose, time.Now()).Print(out)
}

// ConfigDumpTargets are what config-dump can dump.
func ConfigDumpTargets() []string { return []string{"controller", "node"} }

// ErrNoConfigDumpTarget is config-dump without a target.
var ErrNoConfigDumpTarget = errors.New("config-dump needs a target: controller or node")

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

// Check rejects a target or flags config-dump cannot use, before anything
// is asked of the cluster.
func (o ConfigDumpOptions) Check() error {
	switch o.Target {
	case "":
		return ErrNoConfigDumpTarget
	case "node":
		if o.ProxyID != "" {
			return errors.New("--proxy-id is for config-dump controller (what the controller sent that proxy); config-dump node dumps the node proxy itself: pick it with --node or --pod")
		}
	case "controller":
		if o.Node != "" {
			return errors.New("--node is for config-dump node; for what the controller sent a node's proxy, pass --proxy-id <pod>.<namespace> (see canopyctl proxy-status)")
		}
	default:
		return fmt.Errorf("unknown config-dump target %q: use controller or node", o.Target)
	}
	return nil
}

// ConfigDump prints a component's full configuration as JSON: a node
// proxy's /config_dump, the controller's tables, or what the controller
// sent one proxy.
func ConfigDump(ctx context.Context, c PodReader, opts ConfigDumpOptions, out io.Writer) error {
	if err := opts.Check(); err != nil {
		return err
	}
	var (
		pod  *corev1.Pod
		port int
		path string
		err  error
	)
	if opts.Target == "node" {
		port, path = cluster.NodeAdminPort, "/config_dump"
		pod, err = pickPod(ctx, c, opts.Namespace, cluster.NodeProxyApp, opts.Pod, opts.Node)
	} else {
		port, path = cluster.DebugPort, "/debug/tables"
		if opts.ProxyID != "" {
			path = "/debug/config_dump?" + url.Values{"proxyID": {opts.ProxyID}}.Encode()
		}
		pod, err = pickPod(ctx, c, opts.Namespace, cluster.ControllerApp, opts.Pod, "")
	}
	if err != nil {
		return err
	}
	body, err := c.Get(ctx, pod, port, path)
	if err != nil {
		return err
	}
	_, err = out.Write(body)
	return err
}

// nodeProxies are the ready node proxies (on node, if set). Those not
// ready are skipped with a warning on errOut.
func nodeProxies(ctx context.Context, c PodReader, namespace, node string, errOut io.Writer) ([]*corev1.Pod, error) {
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
			fmt.Fprintf(errOut, "warning: %s on node %s is not ready; skipped\n", p.Name, p.Spec.NodeName)
		default:
			out = append(out, p)
		}
	}
	if node != "" && len(out) == 0 {
		return nil, noReadyPodOnNode(pods, namespace, cluster.NodeProxyApp, node)
	}
	return out, nil
}

// noReadyPodOnNode says which nodes do have a ready pod of app.
func noReadyPodOnNode(pods []corev1.Pod, namespace, app, node string) error {
	var nodes []string
	for i := range pods {
		if cluster.Ready(&pods[i]) && !slices.Contains(nodes, pods[i].Spec.NodeName) {
			nodes = append(nodes, pods[i].Spec.NodeName)
		}
	}
	slices.Sort(nodes)
	if len(nodes) == 0 {
		return fmt.Errorf("no ready %s pod on node %s, nor on any other: see kubectl -n %s describe pods -l %s", app, node, namespace, cluster.Selector(app))
	}
	return fmt.Errorf("no ready %s pod on node %s: ready ones run on %s (kubectl get nodes lists the nodes)", app, node, strings.Join(nodes, ", "))
}

func nodeDump(ctx context.Context, c PodReader, opts ProxyOptions) (*configdump.Dump, error) {
	pod, err := pickPod(ctx, c, opts.Namespace, cluster.NodeProxyApp, opts.Proxy, "")
	if err != nil {
		return nil, err
	}
	return fetchDump(ctx, c, pod)
}

func fetchDump(ctx context.Context, c PodReader, pod *corev1.Pod) (*configdump.Dump, error) {
	body, err := c.Get(ctx, pod, cluster.NodeAdminPort, "/config_dump")
	if err != nil {
		return nil, err
	}
	var d configdump.Dump
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("decode the config_dump of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return &d, nil
}

// pickPod is the named pod, else a ready pod of app (on node, if given).
func pickPod(ctx context.Context, c PodReader, namespace, app, name, node string) (*corev1.Pod, error) {
	if name != "" {
		p, err := c.Pod(ctx, namespace, name)
		if err != nil {
			return nil, fmt.Errorf("%w: kubectl -n %s get pods -l %s lists them", err, namespace, cluster.Selector(app))
		}
		return p, nil
	}
	pods, err := c.Pods(ctx, namespace, app)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if (node == "" || pods[i].Spec.NodeName == node) && cluster.Ready(&pods[i]) {
			return &pods[i], nil
		}
	}
	if node != "" {
		return nil, noReadyPodOnNode(pods, namespace, app, node)
	}
	return nil, fmt.Errorf("no ready %s pod in namespace %s (%d not ready): see kubectl -n %s describe pods -l %s", app, namespace, len(pods), namespace, cluster.Selector(app))
}

func printData(w io.Writer, o Output, v any) error {
	if o == YAML {
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
	// Denied keeps the rows with connections an authorization policy
	// refused.
	Denied bool
	Output Output
}

// Traffic shows the connections node proxies have carried, by source and
// destination workload, identities and security: whether traffic went
// over mutual TLS between the identities it should, and how many
// connections authorization policies refused.
func Traffic(ctx context.Context, c PodReader, opts TrafficOptions, out, errOut io.Writer) error {
	pods, err := nodeProxies(ctx, c, opts.Namespace, opts.Node, errOut)
	if err != nil {
		return err
	}
	all := []view.Connection{}
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
	if opts.Denied {
		all = view.Denied(all)
	}
	switch {
	case opts.Output.data():
		return printData(out, opts.Output, all)
	case len(all) == 0:
		msg := "No connections found"
		if opts.Denied {
			msg = "No denied connections found"
		}
		if opts.Node != "" {
			msg += " on node " + opts.Node
		}
		fmt.Fprintln(errOut, msg+".")
		return nil
	}
	return view.TrafficTable(all).Print(out)
}
