package identity_test

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/ca/authn"
	"github.com/canopy-mesh/canopy/ca/identity"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestImpersonationMatrix runs every impersonation case with real pods,
// real pod-bound tokens and real TokenReviews.
func TestImpersonationMatrix(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	c := env.Client
	proxyNS := env.Namespace(t, "canopy-system", nil)
	appNS := env.Namespace(t, "shop", nil)

	account := func(ns, name string) {
		t.Helper()
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(ns, name, sa, node string) *corev1.Pod {
		t.Helper()
		p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "canopy/echo"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, a := range [][2]string{{proxyNS, "canopy-node"}, {proxyNS, "intruder"}, {appNS, "web"}, {appNS, "api"}, {appNS, "batch"}} {
		account(a[0], a[1])
	}
	proxy := pod(proxyNS, "canopy-node-a", "canopy-node", "node-1")
	intruder := pod(proxyNS, "intruder", "intruder", "node-1")
	pod(appNS, "web-1", "web", "node-1")
	pod(appNS, "api-1", "api", "node-2")
	done := pod(appNS, "batch-1", "batch", "node-1")
	succeeded, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": "Succeeded"}})
	if _, err := c.CoreV1().Pods(appNS).Patch(ctx, done.Name, types.MergePatchType, succeeded, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	authenticator, err := authn.New(authn.Config{LocalCluster: "Kubernetes", DisableCache: true,
		Clusters: map[string]authn.TokenReviewer{"Kubernetes": authn.Reviewer{Client: c.AuthenticationV1()}}})
	if err != nil {
		t.Fatal(err)
	}
	decider := identity.Decider{
		TrustDomain:         "cluster.local",
		TrustedNodeAccounts: []identity.Account{{Namespace: proxyNS, Name: "canopy-node"}},
		Pods:                identity.APIPods{Client: c},
	}
	token := func(ns, sa string, p *corev1.Pod) string {
		t.Helper()
		tok, err := env.Token(ctx, ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: p})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	id := func(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

	for _, tt := range []struct {
		name         string
		token        string
		impersonated string
		want         string
		wantErr      error
	}{
		{name: "own identity", token: token(appNS, "web", nil), want: id(appNS, "web")},
		{name: "node proxy for a pod on its node", token: token(proxyNS, "canopy-node", proxy), impersonated: id(appNS, "web"), want: id(appNS, "web")},
		{name: "node proxy without impersonation gets its own", token: token(proxyNS, "canopy-node", proxy), want: id(proxyNS, "canopy-node")},
		{name: "pod on another node", token: token(proxyNS, "canopy-node", proxy), impersonated: id(appNS, "api"), wantErr: identity.ErrNoPodOnNode},
		{name: "identity without any pod", token: token(proxyNS, "canopy-node", proxy), impersonated: id(appNS, "ghost"), wantErr: identity.ErrNoPodOnNode},
		{name: "only a finished pod", token: token(proxyNS, "canopy-node", proxy), impersonated: id(appNS, "batch"), wantErr: identity.ErrNoPodOnNode},
		{name: "untrusted account", token: token(proxyNS, "intruder", intruder), impersonated: id(appNS, "web"), wantErr: identity.ErrUntrustedImpersonator},
		{name: "workload impersonating", token: token(appNS, "web", nil), impersonated: id(appNS, "api"), wantErr: identity.ErrUntrustedImpersonator},
		{name: "token not bound to a pod", token: token(proxyNS, "canopy-node", nil), impersonated: id(appNS, "web"), wantErr: identity.ErrNotPodBound},
		{name: "another trust domain", token: token(proxyNS, "canopy-node", proxy), impersonated: "spiffe://other.example/ns/" + appNS + "/sa/web", wantErr: identity.ErrForeignTrustDomain},
		{name: "malformed identity", token: token(proxyNS, "canopy-node", proxy), impersonated: "web", wantErr: identity.ErrMalformedIdentity},
	} {
		t.Run(tt.name, func(t *testing.T) {
			caller, err := authenticator.Authenticate(ctx, tt.token, "")
			if err != nil {
				t.Fatal(err)
			}
			got, err := decider.Decide(ctx, caller, tt.impersonated)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Decide() = %v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Errorf("Decide() = %v, %v; want %s", got, err, tt.want)
			}
		})
	}

	// A token that outlives its pod (deleted and created again under the
	// same name) no longer speaks for the node proxy.
	stale := token(proxyNS, "canopy-node", proxy)
	staleCaller, err := authenticator.Authenticate(ctx, stale, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Pods(proxyNS).Delete(ctx, proxy.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	pod(proxyNS, "canopy-node-a", "canopy-node", "node-1")
	if _, err := decider.Decide(ctx, staleCaller, id(appNS, "web")); !errors.Is(err, identity.ErrCallerPod) {
		t.Errorf("stale pod-bound caller: %v, want ErrCallerPod", err)
	}
}
