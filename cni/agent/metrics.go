package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/redirect"
)

// Values of the metrics' mode label: how the pod's traffic is redirected.
const (
	modeAmbient = "ambient"
	modeSidecar = "sidecar"
)

func modeOf(cfg redirect.PodConfig) string {
	if cfg.Sidecar != nil {
		return modeSidecar
	}
	return modeAmbient
}

// decisionMode is the mode of a pod for the mesh, even one whose settings
// fail.
func decisionMode(d enroll.Decision) string {
	if d.Sidecar {
		return modeSidecar
	}
	return modeAmbient
}

type metrics struct {
	enrollments   *prometheus.CounterVec
	verifications *prometheus.CounterVec
	enrolled      *prometheus.GaugeVec
	unenrollable  prometheus.Gauge
	unregistered  prometheus.Gauge
	hostRepairs   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_cni_enrollments_total",
			Help: "Pod enrollments by outcome (enabled; pending: no node proxy yet; failed) and mode (ambient: to the node proxy; sidecar: the pod's own proxy's capture).",
		}, []string{"outcome", "mode"}),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_cni_verifications_total",
			Help: "Checks of an enrolled pod's rules in its netns by outcome (verified, repaired, netns_replaced, failed) and mode (ambient, sidecar).",
		}, []string{"outcome", "mode"}),
		enrolled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "canopy_cni_enrolled_pods", Help: "Pods whose traffic the agent redirects, by mode (ambient, sidecar).",
		}, []string{"mode"}),
		unenrollable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "canopy_cni_unenrollable_pods", Help: "Pods the agent should enroll and cannot (see their mesh.canopy.dev/Enrolled condition).",
		}),
		unregistered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "canopy_cni_unregistered_pods", Help: "Served ambient pods whose socket map lacks some of the node proxy's sockets, whose traffic to them is dropped (ebpf backend only; the agent logs which).",
		}),
		hostRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "canopy_cni_host_rules_repairs_total", Help: "Times the host probe rules were found drifted and rewritten.",
		}),
	}
	for _, c := range []prometheus.Collector{m.enrollments, m.verifications, m.enrolled, m.unenrollable, m.unregistered, m.hostRepairs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
