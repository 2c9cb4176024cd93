package dns

import (
	"github.com/prometheus/client_golang/prometheus"
)

// counterFrom is the counter of a gathered family with exactly labels
// (among others), as a Collector for testutil.ToFloat64; a family or
// series not there reads as a zero counter.
func counterFrom(reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "found"})
	mfs, err := reg.Gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			c.Add(m.GetCounter().GetValue())
		}
	}
	return c
}
