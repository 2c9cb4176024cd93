package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// DNSOptions are canopyctl dns's flags.
type DNSOptions struct {
	// Namespace is where Canopy runs.
	Namespace string
	// Pod is the pod asked about, "<namespace>/<name>".
	Pod    string
	Output Output
}

// DNSFormats are the -o values canopyctl dns takes.
func DNSFormats() []Output { return []Output{JSON, YAML} }

// DNS shows a pod's DNS as its node proxy answers it: the mesh names it
// resolves, with their addresses and services, and the resolvers its
// other queries go to.
func DNS(ctx context.Context, c PodReader, opts DNSOptions, out io.Writer) error {
	ns, name, ok := strings.Cut(opts.Pod, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("dns: %q is not <namespace>/<pod>", opts.Pod)
	}
	pod, err := c.Pod(ctx, ns, name)
	if err != nil {
		return err
	}
	if pod.Spec.NodeName == "" {
		return fmt.Errorf("dns: pod %s is not scheduled to a node yet", opts.Pod)
	}
	proxy, err := pickPod(ctx, c, opts.Namespace, cluster.NodeProxyApp, "", pod.Spec.NodeName)
	if err != nil {
		return err
	}
	body, err := c.Get(ctx, proxy, cluster.NodeAdminPort, "/debug/dns?"+url.Values{"pod": {opts.Pod}}.Encode())
	if err != nil {
		return fmt.Errorf("dns: the node proxy %s on %s: %w (is the pod in the mesh, and the node proxy's DNS on?)", proxy.Name, pod.Spec.NodeName, err)
	}
	var v configdump.DNSView
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("dns: decode the view from %s: %w", proxy.Name, err)
	}
	if opts.Output.data() {
		return printData(out, opts.Output, v)
	}
	resolvers := "none asked yet"
	if len(v.Resolvers) > 0 {
		from := "the pod's resolv.conf"
		if v.ResolversFrom != "pod" {
			from = v.ResolversFrom + ", the pod's own could not be read"
		}
		resolvers = strings.Join(v.Resolvers, ", ") + " (" + from + ")"
	}
	fmt.Fprintf(out, "pod %s, answered by %s on %s (cluster domain %s)\nother names go to: %s\n\n", v.Pod, proxy.Name, pod.Spec.NodeName, v.ClusterDomain, resolvers)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDRESSES\tSERVICE")
	for _, n := range v.Names {
		addrs := strings.Join(n.Addresses, ",")
		if addrs == "" {
			addrs = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, addrs, n.Service)
	}
	return tw.Flush()
}
