package hbone

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := Rate{Burst: 3, PerSecond: 2}
	for _, tt := range []struct {
		name string
		at   []time.Duration // since t0, one take each
		want []bool
	}{
		{"burst then empty", []time.Duration{0, 0, 0, 0}, []bool{true, true, true, false}},
		{"refills at the rate", []time.Duration{0, 0, 0, 0, 500 * time.Millisecond, 500 * time.Millisecond}, []bool{true, true, true, false, true, false}},
		{"refills up to the burst", []time.Duration{0, 0, 0, time.Hour, time.Hour, time.Hour, time.Hour}, []bool{true, true, true, true, true, true, false}},
		{"a clock going back refills nothing", []time.Duration{time.Second, time.Second, time.Second, 0}, []bool{true, true, true, false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b bucket
			var got []bool
			for _, d := range tt.at {
				got = append(got, b.take(r, t0.Add(d)))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("takes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLimitsDefaults(t *testing.T) {
	got := Limits{MaxStreams: 10, Pings: Rate{Burst: 5}}.withDefaults()
	want := DefaultLimits()
	want.MaxStreams = 10
	want.Pings.Burst = 5
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("withDefaults (-want +got):\n%s", diff)
	}
}
