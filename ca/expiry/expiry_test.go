package expiry

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/canopy-mesh/canopy/ca/pki"
)

var start = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// event is one recorded Event.
type event struct{ Object, Type, Reason string }

type recorder struct{ events []event }

func (r *recorder) Event(o runtime.Object, eventtype, reason, _ string) {
	ref := o.(*corev1.ObjectReference)
	r.events = append(r.events, event{ref.Kind + " " + ref.Namespace + "/" + ref.Name, eventtype, reason})
}

// A CA valid from start-1m for 60 days.
func testCA(t *testing.T) *pki.Authority {
	t.Helper()
	ca, err := pki.NewSelfSigned("cluster.local", 60*24*time.Hour, start)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestAssess(t *testing.T) {
	ca := testCA(t)
	end := start.Add(60 * 24 * time.Hour)
	for _, tt := range []struct {
		name  string
		at    time.Time
		level Level
		err   error
	}{
		{"fresh", start, OK, nil},
		{"31 days left", end.Add(-31 * 24 * time.Hour), OK, nil},
		{"29 days left", end.Add(-29 * 24 * time.Hour), Expiring, nil},
		{"11 minutes left", end.Add(-11 * time.Minute), Expiring, nil},
		{"9 minutes left", end.Add(-9 * time.Minute), Unusable, pki.ErrCAExpiring},
		{"expired", end.Add(time.Hour), Unusable, pki.ErrCAExpired},
		{"not yet valid", start.Add(-time.Hour), Unusable, pki.ErrCANotYetValid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := Assess(ca, tt.at, 10*time.Minute, 30*24*time.Hour)
			if f.Level != tt.level || !errors.Is(f.Err, tt.err) || (tt.err == nil) != (f.Err == nil) {
				t.Errorf("Assess() = level %d, err %v; want level %d, err %v", f.Level, f.Err, tt.level, tt.err)
			}
			if !f.NotAfter.Equal(end) {
				t.Errorf("NotAfter = %s, want %s", f.NotAfter, end)
			}
			if (f.Level == OK) != (f.Reason == "" && f.Message == "") {
				t.Errorf("reason %q, message %q for level %d", f.Reason, f.Message, f.Level)
			}
		})
	}
}

// TestMonitor: warnings once a day ahead of the end, errors once an hour
// once the CA cannot sign (checked or heard from a refused request), each
// as a log line and a Warning Event on the CA's Secret; the gauge holds
// the end.
func TestMonitor(t *testing.T) {
	ca := testCA(t)
	end := start.Add(60 * 24 * time.Hour)
	now := start
	var logs bytes.Buffer
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	m, err := New(Config{
		Secret:     &corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: "istio-system", Name: "istio-ca-secret"},
		Registerer: reg, Now: func() time.Time { return now },
	}, ca, rec, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "canopy_ca_certificate_expiry_timestamp_seconds" {
		t.Fatalf("gathered %v, %v; want the expiry gauge", mfs, err)
	}
	if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != float64(end.Unix()) {
		t.Errorf("expiry gauge = %v, want %v", got, end.Unix())
	}
	secret := "Secret istio-system/istio-ca-secret"
	steps := []struct {
		name    string
		advance time.Duration
		alarm   bool
		want    []event
		level   string
	}{
		{"fresh: silent", 0, false, nil, ""},
		{"29 days left: warning", end.Add(-29 * 24 * time.Hour).Sub(start), false, []event{{secret, "Warning", ReasonExpiringSoon}}, "WARN"},
		{"an hour later: not again", time.Hour, false, nil, ""},
		{"a day later: again", 24 * time.Hour, false, []event{{secret, "Warning", ReasonExpiringSoon}}, "WARN"},
		{"expired: error", 30 * 24 * time.Hour, false, []event{{secret, "Warning", ReasonUnusable}}, "ERROR"},
		{"a refused request a minute later: not again", time.Minute, true, nil, ""},
		{"a refused request an hour later: again", time.Hour, true, []event{{secret, "Warning", ReasonUnusable}}, "ERROR"},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		rec.events = nil
		logs.Reset()
		if s.alarm {
			m.CAUnusable(pki.ErrCAExpired)
		} else {
			m.Check()
		}
		if diff := cmp.Diff(s.want, rec.events); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", s.name, diff)
		}
		if got := logs.String(); s.level == "" && got != "" || s.level != "" && !strings.Contains(got, "level="+s.level) {
			t.Errorf("%s: log %q, want level %q", s.name, got, s.level)
		}
	}
}

// TestMonitorEventsWhen: a replica that does not lead logs its findings
// but sends no Event; once it leads, its next check sends the Event at
// once, without waiting for the repeat interval, and then keeps to it.
func TestMonitorEventsWhen(t *testing.T) {
	ca := testCA(t)
	now := start.Add(31 * 24 * time.Hour) // 29 days left
	leading := false
	rec := &recorder{}
	var logs bytes.Buffer
	m, err := New(Config{
		Secret: &corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: "istio-system", Name: "istio-ca-secret"},
		Now:    func() time.Time { return now }, EventsWhen: func() bool { return leading },
	}, ca, rec, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	secret := "Secret istio-system/istio-ca-secret"
	for _, s := range []struct {
		name     string
		advance  time.Duration
		leading  bool
		want     []event
		wantLogs bool
	}{
		{"following: logged, no Event", 0, false, nil, true},
		{"leading a minute later: the Event, no log", time.Minute, true, []event{{secret, "Warning", ReasonExpiringSoon}}, false},
		{"an hour later: nothing", time.Hour, true, nil, false},
		{"a day later: both", 24 * time.Hour, true, []event{{secret, "Warning", ReasonExpiringSoon}}, true},
	} {
		now = now.Add(s.advance)
		leading = s.leading
		rec.events = nil
		logs.Reset()
		m.Check()
		if diff := cmp.Diff(s.want, rec.events); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", s.name, diff)
		}
		if got := logs.Len() > 0; got != s.wantLogs {
			t.Errorf("%s: logged %v, want %v: %q", s.name, got, s.wantLogs, logs.String())
		}
	}
}
