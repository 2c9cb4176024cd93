package reload

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/ca/pki"
)

func TestCheck(t *testing.T) {
	now := time.Now()
	first, err := pki.NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	second, err := pki.NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	// The same material read again is a new value, not a change.
	again := *first
	both := *first
	both.Roots = append(append(both.Roots[:0:0], first.Roots...), second.Roots...)

	var next *pki.Authority
	var loadErr error
	w := New(first, func(context.Context, time.Time) (*pki.Authority, error) { return next, loadErr }, time.Hour, slog.New(slog.DiscardHandler))
	var seen []string
	w.OnChange(func(a *pki.Authority) { seen = append(seen, "bundle:"+name(a, first, second, &both)) })
	w.OnChange(func(a *pki.Authority) { seen = append(seen, "signer:"+name(a, first, second, &both)) })

	for _, step := range []struct {
		name    string
		next    *pki.Authority
		err     error
		changed bool
		current *pki.Authority
	}{
		{"unchanged", &again, nil, false, first},
		{"a second root in the bundle", &both, nil, true, &both},
		{"broken material keeps the current CA", nil, errors.New("ca-key.pem does not match"), false, &both},
		{"signing with the new root", second, nil, true, second},
	} {
		next, loadErr = step.next, step.err
		changed, err := w.Check(context.Background(), now)
		if changed != step.changed || (err != nil) != (step.err != nil) {
			t.Fatalf("%s: Check = %v, %v", step.name, changed, err)
		}
		if w.Current() != step.current {
			t.Fatalf("%s: the current CA is not the expected one", step.name)
		}
	}
	want := []string{"bundle:both", "signer:both", "bundle:second", "signer:second"}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("subscribers heard (-want +got):\n%s", diff)
	}
}

func name(a, first, second, both *pki.Authority) string {
	switch a {
	case first:
		return "first"
	case second:
		return "second"
	case both:
		return "both"
	}
	return "?"
}
