package identity

import (
	"testing"
	"time"
)

func TestRenewalAt(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	noJitter := func(int64) int64 { return 0 }
	fullJitter := func(n int64) int64 { return n - 1 }
	for _, tc := range []struct {
		name                string
		notBefore, notAfter time.Time
		jitter              func(int64) int64
		want                time.Time
	}{
		{"half-life", now, now.Add(24 * time.Hour), noJitter, now.Add(12 * time.Hour)},
		{"jitter takes up to a tenth", now, now.Add(10 * time.Hour), fullJitter, now.Add(4 * time.Hour).Add(time.Nanosecond)},
		{"past half-life renews now", now.Add(-20 * time.Hour), now.Add(4 * time.Hour), noJitter, now},
		{"expired renews now", now.Add(-2 * time.Hour), now.Add(-time.Hour), noJitter, now},
		// An expired CA signs leaves whose NotAfter (clamped to the CA's)
		// precedes their NotBefore.
		{"negative lifetime renews now", now.Add(-time.Minute), now.Add(-2 * time.Hour), noJitter, now},
		{"empty lifetime renews now", now, now, noJitter, now},
		{"one nanosecond", now, now.Add(time.Nanosecond), fullJitter, now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renewalAt(tc.notBefore, tc.notAfter, now, tc.jitter); !got.Equal(tc.want) {
				t.Errorf("renewalAt = %s, want %s", got, tc.want)
			}
		})
	}
}

// FuzzRenewalAt: any dates, never a panic, never a time before now, and
// never after the certificate's end when it has one left.
func FuzzRenewalAt(f *testing.F) {
	f.Add(int64(0), int64(24*time.Hour), int64(time.Hour), int64(0))
	f.Add(int64(0), int64(-2*time.Hour), int64(time.Minute), int64(7))
	f.Add(int64(0), int64(1), int64(0), int64(-1))
	f.Fuzz(func(t *testing.T, nb, na, now, j int64) {
		base := time.Unix(0, 0)
		notBefore, notAfter, at := base.Add(time.Duration(nb)), base.Add(time.Duration(na)), base.Add(time.Duration(now))
		got := renewalAt(notBefore, notAfter, at, func(n int64) int64 {
			if n <= 0 {
				t.Fatalf("jitter asked for a bound of %d", n)
			}
			return ((j % n) + n) % n
		})
		if got.Before(at) {
			t.Fatalf("renewal at %s, before now %s", got, at)
		}
		if notAfter.After(at) && notAfter.After(notBefore) && got.After(notAfter) {
			t.Fatalf("renewal at %s, after the certificate expires at %s", got, notAfter)
		}
	})
}
