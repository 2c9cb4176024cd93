package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/canopy-mesh/canopy/ctl/cluster"
)

// VersionOptions are canopyctl version's inputs.
type VersionOptions struct {
	Namespace string
	Client    string
}

// Version prints canopyctl's version and each component's, read from the
// version label the chart stamps on every pod.
func Version(ctx context.Context, c *cluster.Cluster, opts VersionOptions, w io.Writer) error {
	fmt.Fprintf(w, "client version: %s\n", opts.Client)
	for _, app := range []string{cluster.ControllerApp, cluster.CNIAgentApp, cluster.NodeProxyApp} {
		pods, err := c.Pods(ctx, opts.Namespace, app)
		if err != nil {
			if app == cluster.ControllerApp {
				return err
			}
			fmt.Fprintf(w, "%s: none\n", app)
			continue
		}
		seen := map[string]int{}
		var order []string
		for _, p := range pods {
			v := p.Labels["app.kubernetes.io/version"]
			if v == "" {
				v = "unknown"
			}
			if seen[v] == 0 {
				order = append(order, v)
			}
			seen[v]++
		}
		parts := make([]string, 0, len(order))
		for _, v := range order {
			parts = append(parts, fmt.Sprintf("%s (%d pods)", v, seen[v]))
		}
		fmt.Fprintf(w, "%s version: %s\n", app, strings.Join(parts, ", "))
	}
	return nil
}
