package ci

import (
	"fmt"
	"testing"
)

type recorder struct{ failed, skipped string }

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }

func TestUnavailable(t *testing.T) {
	for _, tt := range []struct {
		env      string
		wantFail bool
	}{
		{"true", true},
		{"1", true},
		{"", false},
		{"false", false},
		{"nonsense", false},
	} {
		t.Run("CI="+tt.env, func(t *testing.T) {
			t.Setenv("CI", tt.env)
			var r recorder
			Unavailable(&r, "no %s", "etcd")
			if got := r.failed != ""; got != tt.wantFail {
				t.Errorf("failed = %q, skipped = %q; want fail %v", r.failed, r.skipped, tt.wantFail)
			}
			if r.failed == "" && r.skipped == "" {
				t.Error("neither failed nor skipped")
			}
		})
	}
}
