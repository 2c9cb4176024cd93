package authn_test

import (
	"errors"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestRealTokenReview authenticates real tokens against the API server.
func TestRealTokenReview(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	ns := env.Namespace(t, "authn", nil)
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authn.New(authn.Config{LocalCluster: "Kubernetes", Clusters: map[string]authn.TokenReviewer{
		"Kubernetes": authn.Reviewer{Client: env.Client.AuthenticationV1()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	bound, err := env.Token(ctx, ns, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Authenticate(ctx, bound, "")
	if err != nil {
		t.Fatal(err)
	}
	want := authn.Caller{Cluster: "Kubernetes", Namespace: ns, ServiceAccount: "default", PodName: "web", PodUID: string(pod.UID)}
	if got != want {
		t.Errorf("caller = %+v, want %+v", got, want)
	}
	otherAudience, err := env.Token(ctx, ns, "default", testenv.TokenOptions{Audiences: []string{"something-else"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, otherAudience, ""); !errors.Is(err, authn.ErrRejected) {
		t.Errorf("token for another audience: %v, want ErrRejected", err)
	}
	if _, err := a.Authenticate(ctx, "not-a-jwt", ""); !errors.Is(err, authn.ErrRejected) {
		t.Errorf("garbage token: %v, want ErrRejected", err)
	}
}
