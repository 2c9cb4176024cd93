package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// L4 connection metrics under Istio's names, so dashboards built for
// ztunnel work. response_flags is "-" for a connection that was carried and
// "DENY" on the close of one an authorization policy refused: a refusal
// counts as opened ("-") and closed ("DENY"), as Istio's node proxy counts it.
var connLabels = []string{
	"reporter",
	"source_workload", "source_workload_namespace", "source_principal",
	"destination_workload", "destination_workload_namespace", "destination_principal",
	"request_protocol", "response_flags", "connection_security_policy",
}

// Values of the response_flags label.
const (
	flagNone   = "-"
	flagDenied = "DENY"
)

// Values of canopy_node_connections_refused_total's reason label.
const (
	// reasonSelfCall: the destination was the proxy itself
	// (route.ErrSelfCall).
	reasonSelfCall = "self_call"
	// reasonLookupFailed: in on-demand mode, the destination was not
	// known in time.
	reasonLookupFailed = "lookup_failed"
	// reasonPodLimit and reasonNodeLimit: Limits.MaxConnectionsPerPod or
	// Limits.MaxConnections was reached.
	reasonPodLimit  = "pod_connection_limit"
	reasonNodeLimit = "node_connection_limit"
	// reasonSourceHandshakeLimit: the connection's source address had
	// Limits.MaxPendingHandshakesPerSource handshakes under way on 15008.
	reasonSourceHandshakeLimit = "source_handshake_limit"
	// reasonNodeHandshakeLimit: a connection still shaking hands on
	// 15008, the oldest of Limits.MaxPendingHandshakes, was closed to
	// make room for a new one.
	reasonNodeHandshakeLimit = "node_handshake_limit"
	// reasonAcceptError: accepting failed (out of descriptors, memory).
	reasonAcceptError = "accept_error"
	// reasonTimeout: a handshake, dial or CONNECT took longer than its
	// limit.
	reasonTimeout = "timeout"
)

type metrics struct {
	opened, closed, sent, received *prometheus.CounterVec
	// refused counts connections the proxy closed before carrying them,
	// for reasons other than policy (those are DENY above).
	refused *prometheus.CounterVec
	// cut counts accepted connections the proxy closed while they were
	// open, for reasons other than policy.
	cut *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	mk := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, connLabels)
	}
	m := &metrics{
		opened:   mk("istio_tcp_connections_opened_total", "TCP connections opened."),
		closed:   mk("istio_tcp_connections_closed_total", "TCP connections closed."),
		sent:     mk("istio_tcp_sent_bytes_total", "Bytes sent to the destination during TCP connections."),
		received: mk("istio_tcp_received_bytes_total", "Bytes received from the destination during TCP connections."),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "canopy_node_connections_refused_total",
			Help: "Connections the node proxy refused before carrying them, by reason."}, []string{"reason"}),
		cut: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "canopy_node_connections_cut_total",
			Help: "Accepted connections the node proxy closed while they were open, by reason (drain_period_over: still open when a stopping proxy's drain period ended)."}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.opened, m.closed, m.sent, m.received, m.refused, m.cut} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// connection is one proxied connection's labels.
type connection struct {
	reporter       string
	src, dst       *workloadapi.Workload
	srcID, dstID   string
	securityPolicy string
}

func (c connection) labels(flag string) []string {
	return []string{c.reporter,
		c.src.GetWorkloadName(), c.src.GetNamespace(), c.srcID,
		c.dst.GetWorkloadName(), c.dst.GetNamespace(), c.dstID,
		"tcp", flag, c.securityPolicy}
}

// open counts a connection and returns the function that records its
// end with the bytes each way (sent: towards the destination); revoked is
// a connection closed because a policy change no longer allows it, whose
// close carries the DENY flag.
func (m *metrics) open(c connection) func(sent, received int64, revoked bool) {
	l := c.labels(flagNone)
	m.opened.WithLabelValues(l...).Inc()
	return func(sent, received int64, revoked bool) {
		end := l
		if revoked {
			end = c.labels(flagDenied)
		}
		m.closed.WithLabelValues(end...).Inc()
		m.sent.WithLabelValues(l...).Add(float64(sent))
		m.received.WithLabelValues(l...).Add(float64(received))
	}
}

// denied counts a connection an authorization policy refused: opened, and
// closed with the DENY flag, with no bytes carried.
func (m *metrics) denied(c connection) {
	m.opened.WithLabelValues(c.labels(flagNone)...).Inc()
	m.closed.WithLabelValues(c.labels(flagDenied)...).Inc()
}

func principal(id workloadapi.Identity) string { return "spiffe://" + id.Principal() }
