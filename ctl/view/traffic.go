package view

import (
	"fmt"
	"io"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Connection is one series of istio_tcp_connections_opened_total: who
// talked to whom, as which identities, over what security, as one node
// proxy reported it.
type Connection struct {
	Node                 string `json:"node"`
	Reporter             string `json:"reporter"`
	Source               string `json:"source"`
	SourcePrincipal      string `json:"sourcePrincipal"`
	Destination          string `json:"destination"`
	DestinationPrincipal string `json:"destinationPrincipal"`
	Security             string `json:"security"`
	Opened               uint64 `json:"opened"`
}

// ParseConnections reads a node proxy's Prometheus text exposition.
func ParseConnections(node string, r io.Reader) ([]Connection, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", node, err)
	}
	fam := families["istio_tcp_connections_opened_total"]
	if fam == nil {
		return nil, nil
	}
	var out []Connection
	for _, m := range fam.GetMetric() {
		l := labels(m)
		out = append(out, Connection{
			Node: node, Reporter: l["reporter"],
			Source:               workloadName(l["source_workload_namespace"], l["source_workload"]),
			SourcePrincipal:      orDash(l["source_principal"]),
			Destination:          workloadName(l["destination_workload_namespace"], l["destination_workload"]),
			DestinationPrincipal: orDash(l["destination_principal"]),
			Security:             l["connection_security_policy"],
			Opened:               uint64(m.GetCounter().GetValue()),
		})
	}
	return out, nil
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

func workloadName(ns, name string) string {
	if name == "" || name == "unknown" {
		return "unknown"
	}
	return ns + "/" + name
}

// TrafficTable is `canopyctl traffic`: NODE REPORTER SOURCE DESTINATION
// SOURCE PRINCIPAL DESTINATION PRINCIPAL SECURITY CONNECTIONS, busiest
// first within a node.
func TrafficTable(cs []Connection) Table {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b Connection) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		if a.Opened != b.Opened {
			if a.Opened > b.Opened {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Source+a.Destination, b.Source+b.Destination)
	})
	t := Table{Header: []string{"NODE", "REPORTER", "SOURCE", "DESTINATION", "SOURCE PRINCIPAL", "DESTINATION PRINCIPAL", "SECURITY", "CONNECTIONS"}}
	for _, c := range cs {
		t.Rows = append(t.Rows, []string{c.Node, c.Reporter, c.Source, c.Destination, c.SourcePrincipal, c.DestinationPrincipal, c.Security, fmt.Sprint(c.Opened)})
	}
	return t
}
