package authn

import (
	"context"
	"errors"
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

func TestCacheReusesPositiveAnswersOnly(t *testing.T) {
	r := &fakeReviewer{answers: map[string]authenticationv1.TokenReviewStatus{
		"good": status("system:serviceaccount:shop:web", nil, "istio-ca"),
	}}
	now := time.Unix(1000, 0)
	a, err := New(Config{LocalCluster: "c", Clusters: map[string]TokenReviewer{"c": r}, CacheTTL: time.Minute, CacheSize: 2,
		Now: func() time.Time { return now }})
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
	for range 2 {
		_, _ = a.Authenticate(t.Context(), "bad", "")
	}
	if n := r.calls.Load(); n != 3 {
		t.Errorf("rejections were cached: %d reviews, want 3", n)
	}
	now = now.Add(2 * time.Minute)
	if _, err := a.Authenticate(t.Context(), "good", ""); err != nil {
		t.Fatal(err)
	}
	if n := r.calls.Load(); n != 4 {
		t.Errorf("an expired cache entry was reused: %d reviews, want 4", n)
	}
	// The cache stays within its bound.
	for _, tok := range []string{"good", "good2", "good3"} {
		r.answers[tok] = status("system:serviceaccount:shop:web", nil, "istio-ca")
		_, _ = a.Authenticate(t.Context(), tok, "")
	}
	if len(a.cache) > 2 {
		t.Errorf("cache holds %d entries, bound is 2", len(a.cache))
	}
}
