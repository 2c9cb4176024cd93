// Package view turns what Canopy's components report (a node proxy's
// /config_dump, the controller's /debug/syncz, node proxies' metrics) into
// canopyctl's tables: rows, filters and sort orders are pure functions,
// printing is a tab writer with istioctl's columns
// (docs/wire-contract.md §8).
package view

import (
	"cmp"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/node/configdump"
)

// Table is a header and rows, printed aligned.
type Table struct {
	Header []string
	Rows   [][]string
}

// Print writes t as istioctl does: columns separated by at least one
// space, no borders.
func (t Table) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// WorkloadFilter selects workloads.
type WorkloadFilter struct {
	Namespace, Node string
	// AmbientOnly keeps workloads whose traffic is carried over HBONE.
	AmbientOnly bool
}

// FilterWorkloads keeps the workloads f selects, sorted as istioctl sorts
// them: by namespace and name, then node.
func FilterWorkloads(ws []configdump.Workload, f WorkloadFilter) []configdump.Workload {
	out := []configdump.Workload{}
	for _, w := range ws {
		if (f.Namespace != "" && w.Namespace != f.Namespace) || (f.Node != "" && w.Node != f.Node) ||
			(f.AmbientOnly && w.Protocol != "HBONE") {
			continue
		}
		out = append(out, w)
	}
	// istioctl sorts by "namespace.name"; compared field by field, without
	// building the string, where no namespace holds a '.'.
	slices.SortStableFunc(out, func(a, b configdump.Workload) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.Node, b.Node))
	})
	return out
}

// WorkloadsTable is `canopyctl workloads`: NAMESPACE POD NAME ADDRESS NODE
// WAYPOINT PROTOCOL; wide adds the identity, status and UID. dataplanes
// marks pods that run a sidecar ("namespace/name" to Dataplane's answer):
// their PROTOCOL says so, as "TCP (sidecar)".
func WorkloadsTable(ws []configdump.Workload, services []configdump.Service, dataplanes map[string]string, wide bool) Table {
	t := Table{Header: []string{"NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"}}
	if wide {
		t.Header = append(t.Header, "SERVICE ACCOUNT", "STATUS", "UID")
	}
	for _, w := range ws {
		addr := strings.Join(w.WorkloadIPs, ",")
		if addr == "" {
			addr = w.Hostname
		}
		protocol := w.Protocol
		if d := dataplanes[w.Namespace+"/"+w.Name]; d != "" {
			protocol += " (" + d + ")"
		}
		row := []string{w.Namespace, w.Name, addr, w.Node, waypointName(w.Waypoint, services), protocol}
		if wide {
			row = append(row, w.ServiceAccount, w.Status, w.UID)
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// Dataplane is what the sidecar injector gave a pod: "sidecar" (Envoy and
// its agent), "proxyless" (the grpc-agent template: an agent only, whose
// gRPC application takes xDS itself), or "" for a pod it left alone.
func Dataplane(p *corev1.Pod) string {
	if p.Annotations["sidecar.istio.io/status"] == "" {
		return ""
	}
	containers := append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...)
	for _, c := range containers {
		if c.Name != "istio-proxy" {
			continue
		}
		for _, e := range c.Env {
			if e.Name == "DISABLE_ENVOY" && e.Value == "true" {
				return "proxyless"
			}
		}
	}
	return "sidecar"
}

// waypointName is the Service a waypoint reference points at: None
// without a waypoint, NA when no known Service matches.
func waypointName(g *configdump.Gateway, services []configdump.Service) string {
	if g == nil || g.Destination == "" {
		return "None"
	}
	for _, s := range services {
		if s.Namespace+"/"+s.Hostname == g.Destination || slices.Contains(s.VIPs, g.Destination) {
			return s.Name
		}
	}
	return "NA"
}

// FilterServices keeps the services of namespace (all if empty).
func FilterServices(services []configdump.Service, namespace string) []configdump.Service {
	out := []configdump.Service{}
	for _, s := range services {
		if namespace == "" || s.Namespace == namespace {
			out = append(out, s)
		}
	}
	return out
}

// ServicesTable is `canopyctl services`: NAMESPACE SERVICE NAME SERVICE
// VIP WAYPOINT ENDPOINTS (healthy/total), sorted by namespace and name.
func ServicesTable(services []configdump.Service, namespace string) Table {
	t := Table{Header: []string{"NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS"}}
	ss := FilterServices(services, namespace)
	slices.SortFunc(ss, func(a, b configdump.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, s := range ss {
		var vips []string
		for _, v := range s.VIPs {
			if _, ip, ok := strings.Cut(v, "/"); ok {
				v = ip
			}
			vips = append(vips, v)
		}
		healthy := 0
		for _, e := range s.Endpoints {
			if e.Status == "Healthy" {
				healthy++
			}
		}
		t.Rows = append(t.Rows, []string{s.Namespace, s.Name, strings.Join(vips, ","), waypointName(s.Waypoint, services),
			fmt.Sprintf("%d/%d", healthy, len(s.Endpoints))})
	}
	return t
}

// FilterPolicies keeps the policies of namespace (all if empty).
func FilterPolicies(ps []configdump.Policy, namespace string) []configdump.Policy {
	out := []configdump.Policy{}
	for _, p := range ps {
		if namespace == "" || p.Namespace == namespace {
			out = append(out, p)
		}
	}
	return out
}

// PoliciesTable is `canopyctl policies`: NAMESPACE POLICY NAME ACTION
// SCOPE.
func PoliciesTable(ps []configdump.Policy, namespace string) Table {
	t := Table{Header: []string{"NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"}}
	ps = FilterPolicies(ps, namespace)
	slices.SortFunc(ps, func(a, b configdump.Policy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, p := range ps {
		action := p.Action
		if p.DryRun {
			action += " (dry run)"
		}
		t.Rows = append(t.Rows, []string{p.Namespace, p.Name, action, p.Scope})
	}
	return t
}

// NodeCertificates are one node proxy's certificates.
type NodeCertificates struct {
	Node, Proxy string
	Certs       []configdump.CertState
}

// CertificatesTable is `canopyctl certificates`: per node proxy, each
// identity's chain and roots: NODE CERTIFICATE NAME TYPE STATUS VALID CERT
// SERIAL NUMBER (hex) NOT AFTER NOT BEFORE, and the time left.
func CertificatesTable(nodes []NodeCertificates, now time.Time) Table {
	t := Table{Header: []string{"NODE", "CERTIFICATE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE", "EXPIRES IN"}}
	for _, n := range nodes {
		for _, cs := range n.Certs {
			for i, c := range cs.CertChain {
				typ := "Intermediate"
				if i == 0 {
					typ = "Leaf"
				}
				t.Rows = append(t.Rows, certRow(n.Node, cs, c, typ, now))
			}
			for _, c := range cs.RootCerts {
				t.Rows = append(t.Rows, certRow(n.Node, cs, c, "Root", now))
			}
		}
	}
	return t
}

func certRow(node string, cs configdump.CertState, c configdump.Certificate, typ string, now time.Time) []string {
	valid := !now.Before(c.ValidFrom) && now.Before(c.ExpirationTime)
	left := "expired"
	if now.Before(c.ExpirationTime) {
		left = age(c.ExpirationTime.Sub(now))
	}
	return []string{node, cs.Identity, typ, cs.State, fmt.Sprint(valid), hexSerial(c.SerialNumber),
		c.ExpirationTime.UTC().Format(time.RFC3339), c.ValidFrom.UTC().Format(time.RFC3339), left}
}

// hexSerial prints a decimal serial number (config_dump's form) in hex,
// as istioctl does; anything else is shown as it is.
func hexSerial(dec string) string {
	n, ok := new(big.Int).SetString(dec, 10)
	if !ok {
		return dec
	}
	return n.Text(16)
}
