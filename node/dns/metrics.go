package dns

import (
	"fmt"
	"strings"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// DNS metrics under Istio's node proxy's names and labels, so that its
// dashboards work.
var dnsLabels = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// Values of canopy_node_dns_dropped_total's reason label.
const (
	// reasonInFlight: the pod had Limits.MaxInFlight queries in hand.
	reasonInFlight = "in_flight_limit"
	// reasonTCPLimit: the pod had Limits.MaxTCPConns connections open.
	reasonTCPLimit = "tcp_connection_limit"
)

type metrics struct {
	requests, upstreamRequests, upstreamFailures *prometheus.CounterVec
	upstreamDuration                             *prometheus.HistogramVec
	dropped                                      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_dns_requests_total", Help: "DNS queries received."}, dnsLabels),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_dns_upstream_requests_total", Help: "DNS queries forwarded to the pod's resolvers."}, dnsLabels),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_dns_upstream_failures_total", Help: "Forwarded DNS queries no resolver answered (answered SERVFAIL)."}, dnsLabels),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "istio_dns_upstream_request_duration_seconds", Help: "Time the pod's resolvers took to answer a forwarded query.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.1, 1, 5},
		}, dnsLabels),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "canopy_node_dns_dropped_total", Help: "DNS queries and TCP connections turned away by a per-pod limit."}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.upstreamRequests, m.upstreamFailures, m.upstreamDuration, m.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register DNS metrics: %w", err)
		}
	}
	return m, nil
}

// queryTypes are the query types that get a label value of their own;
// the others are "other", so that a pod cannot grow the label set.
var queryTypes = map[uint16]bool{
	mdns.TypeA: true, mdns.TypeAAAA: true, mdns.TypeCNAME: true, mdns.TypeSRV: true, mdns.TypeTXT: true,
	mdns.TypePTR: true, mdns.TypeMX: true, mdns.TypeNS: true, mdns.TypeSOA: true, mdns.TypeANY: true,
	mdns.TypeHTTPS: true, mdns.TypeSVCB: true, mdns.TypeCAA: true,
}

func (m *metrics) labels(qtype uint16, network string, src *workloadapi.Workload) prometheus.Labels {
	t := "other"
	if queryTypes[qtype] {
		t = strings.ToLower(mdns.TypeToString[qtype])
	}
	return prometheus.Labels{
		"request_query_type":        t,
		"request_protocol":          network,
		"source_canonical_service":  unknown(src.GetCanonicalName()),
		"source_canonical_revision": unknown(src.GetCanonicalRevision()),
	}
}

func unknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
