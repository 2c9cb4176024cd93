package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/ctl/cluster"
)

// VersionOptions are canopyctl version's inputs.
type VersionOptions struct {
	Namespace string
	Client    string
}

// versionConcurrency bounds the port-forwards open at once: a large
// cluster has a node proxy and a CNI agent per node.
const versionConcurrency = 8

// Version prints canopyctl's version and what each component's pods run,
// asked of the running binaries (/version on the controller's and CNI
// agents' monitoring ports and the node proxies' admin port). A pod that
// cannot be asked shows the version its chart label claims, marked so.
func Version(ctx context.Context, c PodReader, opts VersionOptions, w io.Writer) error {
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
		var mu sync.Mutex
		count := map[string]int{}
		var g errgroup.Group
		g.SetLimit(versionConcurrency)
		for i := range pods {
			g.Go(func() error {
				v := podVersion(ctx, c, &pods[i], comp.port)
				mu.Lock()
				count[v]++
				mu.Unlock()
				return nil
			})
		}
		_ = g.Wait() // podVersion reports failures in its result
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

func podVersion(ctx context.Context, c PodReader, p *corev1.Pod, port int) string {
	label := p.Labels["app.kubernetes.io/version"]
	if !cluster.Ready(p) {
		return label + " (its label; the pod is not ready)"
	}
	body, err := c.Get(ctx, p, port, "/version")
	if err != nil {
		return label + " (its label; asking the pod failed)"
	}
	return strings.TrimSpace(string(body))
}
