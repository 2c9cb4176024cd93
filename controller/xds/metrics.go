package xds

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// shortType is a type's name in metrics and proxy status, as istioctl
// abbreviates it.
func shortType(typeURL string) string {
	switch typeURL {
	case workloadapi.AddressTypeURL:
		return "WDS"
	case workloadapi.AuthorizationTypeURL:
		return "WADS"
	case sidecar.ClusterType:
		return "CDS"
	case sidecar.EndpointType:
		return "EDS"
	case sidecar.ListenerType:
		return "LDS"
	case sidecar.RouteType:
		return "RDS"
	}
	return typeURL
}

type metrics struct {
	pushes        *prometheus.CounterVec
	resourcesSent *prometheus.CounterVec
	pushLatency   *prometheus.HistogramVec
	nacks         *prometheus.CounterVec
	rejected      *prometheus.CounterVec
	cutOff        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, connected, budgetUsed, namesHeld func() float64) (*metrics, error) {
	m := &metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_xds_pushes_total", Help: "xDS responses sent, by type.",
		}, []string{"type"}),
		resourcesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_xds_resources_sent_total", Help: "Resources and removals sent in xDS responses, by type.",
		}, []string{"type"}),
		pushLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "canopy_xds_push_latency_seconds",
			Help:    "Time from a table change to the response carrying it being sent, by type.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_xds_nacks_total", Help: "Responses proxies rejected, by type.",
		}, []string{"type"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_xds_rejected_streams_total", Help: "xDS streams refused or ended by the server, by reason.",
		}, []string{"reason"}),
		cutOff: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "canopy_xds_slow_proxies_disconnected_total", Help: "Proxies disconnected because they did not read a response in time.",
		}),
	}
	gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "canopy_xds_connected_proxies", Help: "Open xDS streams.",
	}, connected)
	used := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "canopy_xds_send_budget_used_bytes", Help: "Bytes of workload responses encoded and not yet written to proxies (bounded by --xds-send-budget-mib).",
	}, budgetUsed)
	names := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "canopy_xds_subscribed_name_bytes",
		Help: "Bytes of resource names the streams hold subscribed, as charged to their callers (each caller at most --xds-caller-names-mib); a request past a caller's bound is counted in canopy_xds_rejected_streams_total{reason=\"caller_names\"}.",
	}, namesHeld)
	for _, c := range []prometheus.Collector{m.pushes, m.resourcesSent, m.pushLatency, m.nacks, m.rejected, m.cutOff, gauge, used, names} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
