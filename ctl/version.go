package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/ctl/cluster"
)

// VersionOptions are canopyctl version's inputs.
type VersionOptions struct {
	Namespace string
	Client    string
}

// Version prints canopyctl's version and what each component's pods run,
// asked of the running binaries (the controller's and the CNI agents'
// monitoring ports, the node proxies' config_dump). A pod that cannot be
// asked shows the version its chart label claims, marked so.
func Version(ctx context.Context, c *cluster.Cluster, opts VersionOptions, w io.Writer) error {
	fmt.Fprintf(w, "client version: %s\n", opts.Client)
	for _, comp := range []struct {
		app  string
		port int
	}{{cluster.ControllerApp, cluster.MonitoringPort}, {cluster.CNIAgentApp, cluster.CNIAgentMonitoringPort}, {cluster.NodeProxyApp, cluster.NodeAdminPort}} {
		pods, err := c.Pods(ctx, opts.Namespace, comp.app)
		if err != nil {
			if comp.app == cluster.ControllerApp {
				return err
			}
			fmt.Fprintf(w, "%s: none\n", comp.app)
			continue
		}
		count := map[string]int{}
		for i := range pods {
			count[podVersion(ctx, c, &pods[i], comp.app, comp.port)]++
		}
		versions := make([]string, 0, len(count))
		for v := range count {
			versions = append(versions, v)
		}
		slices.Sort(versions)
		parts := make([]string, 0, len(versions))
		for _, v := range versions {
			parts = append(parts, fmt.Sprintf("%s (%d pods)", v, count[v]))
		}
		fmt.Fprintf(w, "%s version: %s\n", comp.app, strings.Join(parts, ", "))
	}
	return nil
}

func podVersion(ctx context.Context, c *cluster.Cluster, p *corev1.Pod, app string, port int) string {
	label := p.Labels["app.kubernetes.io/version"]
	if !cluster.Ready(p) {
		return label + " (its label; the pod is not ready)"
	}
	label += " (its label; asking the pod failed)"
	if app == cluster.NodeProxyApp {
		d, err := fetchDump(ctx, c, p)
		if err != nil || d.Version == "" {
			return label
		}
		return d.Version
	}
	body, err := c.Get(ctx, p, port, "/version")
	if err != nil {
		return label
	}
	return strings.TrimSpace(string(body))
}

