package localcluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PrintStatus writes the cluster's components, nodes and pods to w.
func PrintStatus(ctx context.Context, dir string, w io.Writer) error {
	st, err := loadState(dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s (run canopy-local up): %w", dir, err)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "CLUSTER %s\tAPI SERVER %s\tKUBECONFIG %s\n\n", st.Name, st.APIServer, st.Kubeconfig)
	fmt.Fprintln(tw, "COMPONENT\tPID\tSTATE")
	for _, p := range st.Processes {
		state := "running"
		if !p.Alive() {
			state = "gone"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.Name, p.PID, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	c, err := Load(dir)
	if err != nil {
		return err
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes (is the API server up?): %w", err)
	}
	fmt.Fprintln(tw, "\nNODE\tSTATUS\tADDRESS\tPOD CIDR\tZONE")
	for _, n := range nodes.Items {
		status := "NotReady"
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				status = "Ready"
			}
		}
		addr := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				addr = a.Address
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, status, addr, n.Spec.PodCIDR, n.Labels[corev1.LabelTopologyZone])
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		a, b := pods.Items[i], pods.Items[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	fmt.Fprintln(tw, "\nNAMESPACE\tPOD\tNODE\tPHASE\tREADY\tIP")
	for _, p := range pods.Items {
		ready := 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready {
				ready++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase,
			ready, len(p.Spec.Containers), strings.Join(podIPs(&p), ","))
	}
	return tw.Flush()
}

func podIPs(p *corev1.Pod) []string {
	var ips []string
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}
