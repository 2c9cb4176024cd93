package xds

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNameBudget: a caller is charged up to its bound and no further (a
// refused charge takes nothing), returns what it was charged, and one
// caller at its bound leaves the others theirs.
func TestNameBudget(t *testing.T) {
	type charge struct {
		caller string
		delta  int64
		held   int64
		ok     bool
	}
	for _, tt := range []struct {
		name    string
		max     int64
		charges []charge
		total   int64
	}{
		{"up to the bound", 100, []charge{{"a", 60, 60, true}, {"a", 40, 100, true}, {"a", 1, 100, false}}, 100},
		{"a refused charge takes nothing", 100, []charge{{"a", 60, 60, true}, {"a", 50, 60, false}, {"a", 40, 100, true}}, 100},
		{"returned bytes are room again", 100, []charge{{"a", 100, 100, true}, {"a", -30, 70, true}, {"a", 30, 100, true}}, 100},
		{"per caller", 100, []charge{{"a", 100, 100, true}, {"b", 100, 100, true}, {"b", 1, 100, false}}, 200},
		{"all returned", 100, []charge{{"a", 80, 80, true}, {"a", -80, 0, true}}, 0},
		{"no bound", 0, []charge{{"a", 1 << 40, 1 << 40, true}}, 1 << 40},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &nameBudget{max: tt.max, held: map[string]int64{}}
			var got []charge
			for _, c := range tt.charges {
				held, ok := b.charge(c.caller, c.delta)
				got = append(got, charge{c.caller, c.delta, held, ok})
			}
			if diff := cmp.Diff(tt.charges, got, cmp.AllowUnexported(charge{})); diff != "" {
				t.Errorf("charges (-want +got):\n%s", diff)
			}
			if got := b.Total(); got != tt.total {
				t.Errorf("Total() = %d, want %d", got, tt.total)
			}
			if tt.total == 0 && len(b.held) != 0 {
				t.Errorf("callers that hold nothing are kept: %v", b.held)
			}
		})
	}
}
