package authn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// fakeReviewer answers from a table and counts calls.
type fakeReviewer struct {
	answers map[string]authenticationv1.TokenReviewStatus
	calls   atomic.Int32
}

func (f *fakeReviewer) Review(_ context.Context, token string, _ []string) (authenticationv1.TokenReviewStatus, error) {
	f.calls.Add(1)
	if token == "broken" {
		return authenticationv1.TokenReviewStatus{}, errors.New("api server down")
	}
	return f.answers[token], nil
}

func status(user string, extra map[string]authenticationv1.ExtraValue, aud ...string) authenticationv1.TokenReviewStatus {
	return authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: aud, User: authenticationv1.UserInfo{Username: user, Extra: extra}}
}

func TestAuthenticate(t *testing.T) {
	local := &fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"pod":        status("system:serviceaccount:shop:web", map[string]authenticationv1.ExtraValue{extraPod: {"web-1"}, extraPodID: {"uid-1"}}, "istio-ca"),
		"user":       status("alice", nil, "istio-ca"),
		"wrong-aud":  status("system:serviceaccount:shop:web", nil, "kubernetes"),
		"rejected":   {Authenticated: false, Error: "token has expired"},
		"no-aud":     status("system:serviceaccount:a:b", nil),
		"colon-name": status("system:serviceaccount:a:b:c", nil, "istio-ca"),
	}}
	remote := &fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"pod": status("system:serviceaccount:east:api", nil, "istio-ca"),
	}}
	a, err := New(Config{LocalCluster: "Kubernetes", Clusters: map[string]TokenReviewer{"Kubernetes": local, "east": remote}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, token, cluster string
		want                 Caller
		wantErr              error
	}{
		{name: "pod-bound token", token: "pod", want: Caller{Cluster: "Kubernetes", Namespace: "shop", ServiceAccount: "web", PodName: "web-1", PodUID: "uid-1"}},
		{name: "explicit local cluster", token: "pod", cluster: "Kubernetes", want: Caller{Cluster: "Kubernetes", Namespace: "shop", ServiceAccount: "web", PodName: "web-1", PodUID: "uid-1"}},
		{name: "remote cluster", token: "pod", cluster: "east", want: Caller{Cluster: "east", Namespace: "east", ServiceAccount: "api"}},
		{name: "no audiences echoed", token: "no-aud", want: Caller{Cluster: "Kubernetes", Namespace: "a", ServiceAccount: "b"}},
		{name: "no token", wantErr: ErrNoToken},
		{name: "unknown cluster", token: "pod", cluster: "west", wantErr: ErrUnknownCluster},
		{name: "not a service account", token: "user", wantErr: ErrNotWorkload},
		{name: "malformed service account", token: "colon-name", wantErr: ErrNotWorkload},
		{name: "wrong audience", token: "wrong-aud", wantErr: ErrRejected},
		{name: "expired", token: "rejected", wantErr: ErrRejected},
		{name: "unknown token", token: "nope", wantErr: ErrRejected},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.Authenticate(t.Context(), tt.token, tt.cluster)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Authenticate() = %+v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Authenticate() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	if _, err := a.Authenticate(t.Context(), "broken", ""); err == nil || errors.Is(err, ErrRejected) {
		t.Errorf("review failure = %v, want an error that is not a rejection", err)
	}
	if _, err := New(Config{LocalCluster: "x"}); err == nil {
		t.Error("New without a local reviewer succeeded")
	}
}

func TestCache(t *testing.T) {
	r := &fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"good": status("system:serviceaccount:shop:web", nil, "istio-ca"),
	}}
	now := time.Unix(1000, 0)
	a, err := New(Config{LocalCluster: "c", Clusters: map[string]TokenReviewer{"c": r}, CacheTTL: time.Minute, CacheSize: 2,
		NegativeTTL: 10 * time.Second, NegativeCacheSize: 2, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := a.Authenticate(t.Context(), "good", ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.calls.Load(); n != 1 {
		t.Errorf("%d reviews for three uses of a cached token, want 1", n)
	}
	// A rejection is remembered for NegativeTTL, and still a rejection.
	for range 3 {
		if _, err := a.Authenticate(t.Context(), "bad", ""); !errors.Is(err, ErrRejected) {
			t.Fatalf("cached rejection = %v, want ErrRejected", err)
		}
	}
	if n := r.calls.Load(); n != 2 {
		t.Errorf("rejections were not cached: %d reviews, want 2", n)
	}
	now = now.Add(11 * time.Second)
	_, _ = a.Authenticate(t.Context(), "bad", "")
	if n := r.calls.Load(); n != 3 {
		t.Errorf("an expired rejection was reused: %d reviews, want 3", n)
	}
	// A failure to ask is not an answer: it is never cached.
	for range 2 {
		_, _ = a.Authenticate(t.Context(), "broken", "")
	}
	if n := r.calls.Load(); n != 5 {
		t.Errorf("a failed review was cached: %d reviews, want 5", n)
	}
	now = now.Add(2 * time.Minute)
	if _, err := a.Authenticate(t.Context(), "good", ""); err != nil {
		t.Fatal(err)
	}
	if n := r.calls.Load(); n != 6 {
		t.Errorf("an expired cache entry was reused: %d reviews, want 6", n)
	}
	// Both caches stay within their bounds.
	for _, tok := range []string{"good", "good2", "good3", "bad2", "bad3", "bad4"} {
		if strings.HasPrefix(tok, "good") {
			r.answers[tok] = status("system:serviceaccount:shop:web", nil, "istio-ca")
		}
		_, _ = a.Authenticate(t.Context(), tok, "")
	}
	if len(a.cache) > 2 || len(a.rejected) > 2 {
		t.Errorf("caches hold %d and %d entries, bound is 2", len(a.cache), len(a.rejected))
	}
}

// TestReviewBudget: bogus tokens beyond the budget are refused without a
// review, a token cached as valid is never held up by the budget, and the
// budget refills with time.
func TestReviewBudget(t *testing.T) {
	r := &fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"good": status("system:serviceaccount:shop:web", nil, "istio-ca"),
		"new":  status("system:serviceaccount:shop:api", nil, "istio-ca"),
	}}
	now := time.Unix(1000, 0)
	a, err := New(Config{LocalCluster: "c", Clusters: map[string]TokenReviewer{"c": r},
		ReviewQPS: 10, ReviewBurst: 20, ReviewWait: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(t.Context(), "good", ""); err != nil {
		t.Fatal(err)
	}
	var throttled, rejected int
	for i := range 200 {
		_, err := a.Authenticate(t.Context(), fmt.Sprintf("bogus-%d", i), "")
		switch {
		case errors.Is(err, ErrThrottled):
			throttled++
		case errors.Is(err, ErrRejected):
			rejected++
		default:
			t.Fatalf("bogus token: %v", err)
		}
	}
	if got, want := [3]int{rejected, throttled, int(r.calls.Load())}, [3]int{19, 181, 20}; got != want {
		t.Errorf("(rejected, throttled, reviews) = %v, want %v", got, want)
	}
	if _, err := a.Authenticate(t.Context(), "good", ""); err != nil {
		t.Errorf("a cached valid token waited for the spent budget: %v", err)
	}
	if _, err := a.Authenticate(t.Context(), "new", ""); !errors.Is(err, ErrThrottled) {
		t.Errorf("new token with the budget spent: %v, want ErrThrottled", err)
	}
	now = now.Add(time.Second)
	if _, err := a.Authenticate(t.Context(), "new", ""); err != nil {
		t.Errorf("new token once the budget refilled: %v", err)
	}
	// Each cluster has a budget of its own; none at all when disabled.
	unlimited, err := New(Config{LocalCluster: "c", Clusters: map[string]TokenReviewer{"c": r}, ReviewQPS: -1, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := unlimited.Authenticate(t.Context(), fmt.Sprintf("bogus-%d", i), ""); !errors.Is(err, ErrRejected) {
			t.Fatalf("without a budget: %v, want ErrRejected", err)
		}
	}
}

// slowReviewer answers after release is closed.
type slowReviewer struct {
	fakeReviewer
	release chan struct{}
}

func (s *slowReviewer) Review(ctx context.Context, token string, aud []string) (authenticationv1.TokenReviewStatus, error) {
	<-s.release
	return s.fakeReviewer.Review(ctx, token, aud)
}

// TestConcurrentUsesShareAReview: requests that arrive with one token
// while it is being reviewed wait for that review instead of making their
// own, even when the first of them gives up.
func TestConcurrentUsesShareAReview(t *testing.T) {
	r := &slowReviewer{release: make(chan struct{}), fakeReviewer: fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"good": status("system:serviceaccount:shop:web", nil, "istio-ca"),
	}}}
	a, err := New(Config{LocalCluster: "c", Clusters: map[string]TokenReviewer{"c": r}})
	if err != nil {
		t.Fatal(err)
	}
	first, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	wg.Go(func() { _, err := a.Authenticate(first, "good", ""); errs <- err })
	for range 19 {
		wg.Go(func() { _, err := a.Authenticate(t.Context(), "good", ""); errs <- err })
	}
	cancel()
	close(r.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Authenticate() = %v", err)
		}
	}
	if n := r.calls.Load(); n > 2 {
		t.Errorf("%d reviews for 20 concurrent uses of one token, want one (two if the first finished early)", n)
	}
}
