package status

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/client-go/tools/record"
)

func drain(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestReporter(t *testing.T) {
	fake := record.NewFakeRecorder(10)
	r := NewReporter(fake)
	r.Report(map[string]string{
		"AuthorizationPolicy shop/ext": "policy not supported by node proxies: action CUSTOM",
		"Pod shop/a":                   "waypoint shop/wp not found",
		"Bogus key":                    "ignored",
	})
	got := drain(fake)
	want := []string{
		"Warning NotAppliedByNodeProxies policy not supported by node proxies: action CUSTOM",
		"Warning NotAppliedByNodeProxies waypoint shop/wp not found",
	}
	if diff := cmp.Diff(want, got, cmp.Transformer("sort", func(s []string) []string {
		out := append([]string(nil), s...)
		for i := range out {
			for j := i + 1; j < len(out); j++ {
				if out[j] < out[i] {
					out[i], out[j] = out[j], out[i]
				}
			}
		}
		return out
	})); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	r.Report(map[string]string{"AuthorizationPolicy shop/ext": "policy not supported by node proxies: action CUSTOM"})
	if got := drain(fake); len(got) != 0 {
		t.Errorf("repeated problem reported again: %v", got)
	}
	r.Report(map[string]string{})
	r.Report(map[string]string{"AuthorizationPolicy shop/ext": "policy not supported by node proxies: action CUSTOM"})
	if got := drain(fake); len(got) != 1 {
		t.Errorf("a problem that came back was not reported: %v", got)
	}
}

// TestReporterFor: a Reporter of another reason writes Events of it, on
// the traffic kinds too.
func TestReporterFor(t *testing.T) {
	fake := record.NewFakeRecorder(10)
	NewReporterFor(fake, ReasonInvalid).Report(map[string]string{
		"VirtualService attacker/ratings":  "sidecars do not get HTTP route 0: bad regex",
		"DestinationRule attacker/ratings": "sidecars that would use this rule get no cluster",
	})
	got := drain(fake)
	want := []string{
		"Warning InvalidConfiguration sidecars do not get HTTP route 0: bad regex",
		"Warning InvalidConfiguration sidecars that would use this rule get no cluster",
	}
	if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
