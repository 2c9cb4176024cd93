// Package expiry watches the CA's own certificate, so that its end is
// seen coming instead of found by node proxies that can no longer get
// certificates. A Monitor exports when the certificate ends
// (canopy_ca_certificate_expiry_timestamp_seconds), and reports on the
// Secret that holds the CA:
//
//   - while less than WarnBefore is left: a Warning log and a Warning Event
//     (reason CACertificateExpiringSoon), once a day;
//   - once the CA cannot sign (pki.Authority.Usable fails: expired, not yet
//     valid, or less than a certificate's minimum lifetime left): an Error
//     log and a Warning Event (reason CACertificateUnusable), checked every
//     Interval and on every refused request, at most once per Interval.
//
// Assess is the pure decision; Monitor does the logging, the Events and the
// metric. A Monitor is safe for concurrent use.
package expiry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/canopy-mesh/canopy/ca/pki"
)

// Event reasons.
const (
	ReasonExpiringSoon = "CACertificateExpiringSoon"
	ReasonUnusable     = "CACertificateUnusable"
)

// Level grades a finding.
type Level int

// Levels of a finding.
const (
	OK Level = iota
	// Expiring: the CA signs, but will not for long.
	Expiring
	// Unusable: the CA signs nothing.
	Unusable
)

// Finding is what Assess says of a CA at a time.
type Finding struct {
	Level Level
	// Reason is the Event reason; Message the Event's and the log's text.
	Reason, Message string
	// NotAfter is the end of the CA's validity.
	NotAfter time.Time
	// Err is why an Unusable CA cannot sign.
	Err error
}

// Assess judges ca at now: Unusable if it cannot sign a certificate of
// minLeaf, Expiring if less than warnBefore is left, else OK.
func Assess(ca *pki.Authority, now time.Time, minLeaf, warnBefore time.Duration) Finding {
	_, notAfter := ca.Validity()
	f := Finding{NotAfter: notAfter}
	if err := ca.Usable(now, minLeaf); err != nil {
		f.Level, f.Reason, f.Err = Unusable, ReasonUnusable, err
		f.Message = fmt.Sprintf("The CA issues no workload certificates: %v. Renew or replace its certificate.", err)
		return f
	}
	if left := notAfter.Sub(now); left < warnBefore {
		f.Level, f.Reason = Expiring, ReasonExpiringSoon
		f.Message = fmt.Sprintf("The CA certificate expires at %s, in %s; it stops issuing workload certificates %s before. Renew or replace it.",
			notAfter.UTC().Format(time.RFC3339), left.Round(time.Minute), minLeaf)
	}
	return f
}

// Recorder writes Kubernetes Events; record.EventRecorder fits.
type Recorder interface {
	Event(object runtime.Object, eventtype, reason, message string)
}

// Config configures a Monitor. Zero durations take the defaults.
type Config struct {
	// Secret is the object the Events are about: the Secret holding the CA.
	Secret *corev1.ObjectReference
	// MinLeafTTL: the CA is unusable with less left (default
	// pki.MinTTL). WarnBefore: how long before its end warnings start
	// (default 30 days).
	MinLeafTTL, WarnBefore time.Duration
	// Interval between checks, and the least time between two reports of
	// an unusable CA (default 1h). WarnEvery: the least time between two
	// warnings of an expiring one (default 24h).
	Interval, WarnEvery time.Duration
	// Registerer receives the gauge; nil registers nowhere.
	Registerer prometheus.Registerer
	// EventsWhen, if set, says whether Events may be written now (the
	// controller replica holds the writers' Lease). Findings withheld are
	// still logged, and are sent as Events at the first check they may be,
	// without waiting for their repeat interval.
	EventsWhen func() bool
	Now        func() time.Time
}

// Monitor watches one CA.
type Monitor struct {
	cfg Config
	ca  atomic.Pointer[pki.Authority]
	rec Recorder
	log *slog.Logger

	mu sync.Mutex
	// last is when each reason was last logged, lastEvent when it was
	// last sent as an Event.
	last, lastEvent map[string]time.Time
}

// New returns a Monitor of ca reporting through rec (nil: logs only).
func New(cfg Config, ca *pki.Authority, rec Recorder, log *slog.Logger) (*Monitor, error) {
	if cfg.MinLeafTTL <= 0 {
		cfg.MinLeafTTL = pki.MinTTL
	}
	if cfg.WarnBefore <= 0 {
		cfg.WarnBefore = 30 * 24 * time.Hour
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Hour
	}
	if cfg.WarnEvery <= 0 {
		cfg.WarnEvery = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if rec != nil && cfg.Secret == nil {
		return nil, errors.New("expiry: Events need the CA Secret's reference")
	}
	m := &Monitor{cfg: cfg, rec: rec, log: log.With("component", "ca-expiry"), last: map[string]time.Time{}, lastEvent: map[string]time.Time{}}
	m.ca.Store(ca)
	if cfg.Registerer != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "canopy_ca_certificate_expiry_timestamp_seconds",
			Help: "When the CA's certificate (or the chain above it) expires, in seconds since the epoch.",
		}, func() float64 {
			_, notAfter := m.ca.Load().Validity()
			return float64(notAfter.Unix())
		})
		if err := cfg.Registerer.Register(g); err != nil {
			return nil, fmt.Errorf("register CA expiry gauge: %w", err)
		}
	}
	return m, nil
}

// Check assesses the CA now and reports what it finds, unless reported
// recently.
func (m *Monitor) Check() {
	m.report(Assess(m.ca.Load(), m.cfg.Now(), m.cfg.MinLeafTTL, m.cfg.WarnBefore))
}

// SetAuthority watches a from now on (the CA rotated) and checks it.
func (m *Monitor) SetAuthority(a *pki.Authority) {
	m.ca.Store(a)
	m.Check()
}

// CAUnusable implements server.Alarm: a request was refused because the CA
// cannot sign.
func (m *Monitor) CAUnusable(error) { m.Check() }

// Run checks at once and then every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	tick := time.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	for {
		m.Check()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (m *Monitor) report(f Finding) {
	if f.Level == OK {
		return
	}
	every := m.cfg.Interval
	if f.Level == Expiring {
		every = m.cfg.WarnEvery
	}
	now := m.cfg.Now()
	due := func(last map[string]time.Time) bool {
		t, seen := last[f.Reason]
		if seen && now.Sub(t) < every {
			return false
		}
		last[f.Reason] = now
		return true
	}
	m.mu.Lock()
	logDue := due(m.last)
	eventDue := m.rec != nil && (m.cfg.EventsWhen == nil || m.cfg.EventsWhen()) && due(m.lastEvent)
	m.mu.Unlock()
	if logDue {
		notAfter := f.NotAfter.UTC().Format(time.RFC3339)
		if f.Level == Unusable {
			m.log.Error("CA certificate cannot sign; no workload certificates are issued", "not_after", notAfter, "err", f.Err)
		} else {
			m.log.Warn("CA certificate expires soon", "not_after", notAfter, "left", f.NotAfter.Sub(now).Round(time.Minute))
		}
	}
	if eventDue {
		m.rec.Event(m.cfg.Secret, corev1.EventTypeWarning, f.Reason, f.Message)
	}
}
