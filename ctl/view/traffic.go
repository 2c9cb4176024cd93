package view

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The node proxy's L4 metrics, under Istio's (and ztunnel's) names.
const (
	openedMetric = "istio_tcp_connections_opened_total"
	closedMetric = "istio_tcp_connections_closed_total"
	// denyFlag is the response_flags value of a connection an
	// authorization policy refused. A refused connection is counted
	// opened with response_flags "-" and closed with "DENY".
	denyFlag = "DENY"
)

// Connection is the connections one node proxy reported between two
// workloads, as which identities, over what security: the series of
// istio_tcp_connections_opened_total and _closed_total with these labels,
// whatever their response_flags.
type Connection struct {
	Node                 string `json:"node"`
	Reporter             string `json:"reporter"`
	Source               string `json:"source"`
	SourcePrincipal      string `json:"sourcePrincipal"`
	Destination          string `json:"destination"`
	DestinationPrincipal string `json:"destinationPrincipal"`
	Security             string `json:"security"`
	// Opened counts the connections opened, denied ones included.
	Opened uint64 `json:"opened"`
	// Denied counts those an authorization policy refused (closed with
	// response_flags="DENY"). Metrics without response_flags (a node
	// proxy older than the label) count none.
	Denied uint64 `json:"denied"`
}

// connKey is what a Connection is grouped by: every field but the counts.
type connKey struct {
	node, reporter, source, sourcePrincipal, destination, destinationPrincipal, security string
}

// ParseConnections reads a node proxy's Prometheus text exposition into
// its connections, sorted by reporter, source and destination.
func ParseConnections(node string, r io.Reader) ([]Connection, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics of node %s: %w", node, err)
	}
	rows := map[connKey]*Connection{}
	row := func(m *dto.Metric) (*Connection, map[string]string) {
		l := labels(m)
		k := connKey{
			node: node, reporter: l["reporter"],
			source:               workloadName(l["source_workload_namespace"], l["source_workload"]),
			sourcePrincipal:      orDash(l["source_principal"]),
			destination:          workloadName(l["destination_workload_namespace"], l["destination_workload"]),
			destinationPrincipal: orDash(l["destination_principal"]),
			security:             l["connection_security_policy"],
		}
		c := rows[k]
		if c == nil {
			c = &Connection{Node: k.node, Reporter: k.reporter, Source: k.source, SourcePrincipal: k.sourcePrincipal,
				Destination: k.destination, DestinationPrincipal: k.destinationPrincipal, Security: k.security}
			rows[k] = c
		}
		return c, l
	}
	for _, m := range families[openedMetric].GetMetric() {
		c, _ := row(m)
		c.Opened += count(m)
	}
	for _, m := range families[closedMetric].GetMetric() {
		if c, l := row(m); l["response_flags"] == denyFlag {
			c.Denied += count(m)
		}
	}
	out := make([]Connection, 0, len(rows))
	for _, c := range rows {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Connection) int {
		return cmp.Or(strings.Compare(a.Reporter, b.Reporter), strings.Compare(a.Source, b.Source),
			strings.Compare(a.Destination, b.Destination), strings.Compare(a.SourcePrincipal, b.SourcePrincipal),
			strings.Compare(a.DestinationPrincipal, b.DestinationPrincipal), strings.Compare(a.Security, b.Security))
	})
	return out, nil
}

// count is a sample's value as a count of connections: a counter's, or
// an untyped sample's (a family without # TYPE). Values no count has
// (negative, NaN, beyond uint64) are clamped.
func count(m *dto.Metric) uint64 {
	v := m.GetCounter().GetValue()
	if m.GetCounter() == nil {
		v = m.GetUntyped().GetValue()
	}
	switch {
	case !(v > 0):
		return 0
	case v >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(v)
}

// Denied keeps the connections with at least one denial.
func Denied(cs []Connection) []Connection {
	out := []Connection{}
	for _, c := range cs {
		if c.Denied > 0 {
			out = append(out, c)
		}
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// workloadName is namespace/name, or the name alone when the namespace
// is not known; "unknown" without a name.
func workloadName(ns, name string) string {
	switch {
	case name == "" || name == "unknown":
		return "unknown"
	case ns == "" || ns == "unknown":
		return name
	}
	return ns + "/" + name
}

// TrafficTable is `canopyctl traffic`: NODE REPORTER SOURCE DESTINATION
// SOURCE PRINCIPAL DESTINATION PRINCIPAL SECURITY CONNECTIONS DENIED,
// busiest first within a node.
func TrafficTable(cs []Connection) Table {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b Connection) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(b.Opened, a.Opened), cmp.Compare(b.Denied, a.Denied),
			strings.Compare(a.Source, b.Source), strings.Compare(a.Destination, b.Destination))
	})
	t := Table{Header: []string{"NODE", "REPORTER", "SOURCE", "DESTINATION", "SOURCE PRINCIPAL", "DESTINATION PRINCIPAL", "SECURITY", "CONNECTIONS", "DENIED"}}
	for _, c := range cs {
		t.Rows = append(t.Rows, []string{c.Node, c.Reporter, c.Source, c.Destination, c.SourcePrincipal, c.DestinationPrincipal, c.Security,
			fmt.Sprint(c.Opened), fmt.Sprint(c.Denied)})
	}
	return t
}
