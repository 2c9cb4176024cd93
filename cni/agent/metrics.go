package agent

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	enrollments   *prometheus.CounterVec
	verifications *prometheus.CounterVec
	enrolled      prometheus.Gauge
	unenrollable  prometheus.Gauge
	hostRepairs   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_cni_enrollments_total",
			Help: "Pod enrollments by outcome: enabled, pending (no node proxy yet), failed.",
		}, []string{"outcome"}),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "canopy_cni_verifications_total",
			Help: "Checks of an enrolled pod's rules in its netns by outcome: verified, repaired, netns_replaced, failed.",
		}, []string{"outcome"}),
		enrolled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "canopy_cni_enrolled_pods", Help: "Pods whose traffic the agent redirects.",
		}),
		unenrollable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "canopy_cni_unenrollable_pods", Help: "Ambient pods the agent cannot enroll (see their mesh.canopy.dev/Enrolled condition).",
		}),
		hostRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "canopy_cni_host_rules_repairs_total", Help: "Times the host probe rules were found drifted and rewritten.",
		}),
	}
	for _, c := range []prometheus.Collector{m.enrollments, m.verifications, m.enrolled, m.unenrollable, m.hostRepairs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
