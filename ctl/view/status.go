package view

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ProxyStatus is one proxy in the controller's /debug/syncz (the fields
// canopyctl shows).
type ProxyStatus struct {
	ProxyID   string       `json:"proxyID"`
	ProxyType string       `json:"proxyType"`
	Cluster   string       `json:"cluster"`
	Node      string       `json:"node"`
	Version   string       `json:"version"`
	Types     []TypeStatus `json:"types"`
}

// TypeStatus is one subscribed type of a proxy.
type TypeStatus struct {
	Type      string    `json:"type"`
	Status    string    `json:"status"`
	LastAcked time.Time `json:"lastAcked"`
	NACK      string    `json:"nack"`
}

// ControllerStatus is what one controller instance reported.
type ControllerStatus struct {
	Controller string
	Proxies    []ProxyStatus
}

// ProxyStatusTable is `canopyctl proxy-status` (wire contract §8.3): NAME
// CLUSTER ISTIOD VERSION SUBSCRIBED TYPES; verbose has a column per type with
// its state and age instead.
func ProxyStatusTable(cs []ControllerStatus, verbose bool, now time.Time) Table {
	type row struct {
		controller string
		p          ProxyStatus
	}
	var rows []row
	typeSet := map[string]bool{}
	for _, c := range cs {
		for _, p := range c.Proxies {
			rows = append(rows, row{c.Controller, p})
			for _, ts := range p.Types {
				typeSet[ts.Type] = true
			}
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.p.ProxyID, b.p.ProxyID) })
	types := make([]string, 0, len(typeSet))
	for t := range typeSet {
		types = append(types, t)
	}
	slices.Sort(types)

	t := Table{Header: []string{"NAME", "CLUSTER", "ISTIOD", "VERSION", "SUBSCRIBED TYPES"}}
	if verbose {
		t.Header = append(append([]string{"NAME", "CLUSTER"}, types...), "ISTIOD", "VERSION")
	}
	for _, r := range rows {
		p := r.p
		if !verbose {
			var names []string
			for _, ts := range p.Types {
				names = append(names, ts.Type)
			}
			// In istioctl's order, that of the types' URLs, which for
			// every type it names (CDS, ECDS, EDS, LDS, RDS, WADS,
			// WDS) is also their short names' order.
			slices.Sort(names)
			t.Rows = append(t.Rows, []string{p.ProxyID, p.Cluster, r.controller, orDash(p.Version), fmt.Sprintf("%d (%s)", len(names), strings.Join(names, ","))})
			continue
		}
		cells := []string{p.ProxyID, p.Cluster}
		for _, typ := range types {
			cells = append(cells, typeCell(p.Types, typ, now))
		}
		t.Rows = append(t.Rows, append(cells, r.controller, orDash(p.Version)))
	}
	return t
}

// typeCell is one type's state: SYNCED (age), STALE, NOT SENT, ERROR, or
// IGNORED when the proxy does not watch it.
func typeCell(ts []TypeStatus, typ string, now time.Time) string {
	for _, s := range ts {
		if s.Type != typ {
			continue
		}
		if s.Status == "SYNCED" && !s.LastAcked.IsZero() {
			return fmt.Sprintf("SYNCED (%s)", age(now.Sub(s.LastAcked)))
		}
		return s.Status
	}
	return "IGNORED"
}

// age prints a duration the way kubectl prints ages: 45s, 3m12s, 2h5m,
// 3d4h.
func age(d time.Duration) string {
	switch d = d.Round(time.Second); {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
