package removal_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/canopy-mesh/canopy/cni/removal"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const (
	dsName  = "canopy-cni"
	podName = "canopy-cni-x7k2p"
	agentSA = "canopy-cni"
)

// run runs w until the test ends and checks that it then returns nil.
func run(t *testing.T, w *removal.Watcher) (done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ch; err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	})
	return ch
}

// TestNotAPod: an agent run by hand, or by something other than a
// DaemonSet, never concludes it is being uninstalled.
func TestNotAPod(t *testing.T) {
	t.Parallel()
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "agent-6d9f", UID: "rs-uid"}}
	owned := func(refs ...metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: podName, OwnerReferences: refs}}
	}
	for _, tt := range []struct {
		name     string
		ns, pod  string
		objects  []*corev1.Pod
		wantRead bool
	}{
		{name: "no pod name or namespace"},
		{name: "no pod name", ns: "istio-system"},
		{name: "no owner", ns: "istio-system", pod: podName, objects: []*corev1.Pod{owned()}, wantRead: true},
		{name: "owned by a ReplicaSet", ns: "istio-system", pod: podName, wantRead: true, objects: []*corev1.Pod{owned(
			*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet")))}},
		{name: "a DaemonSet owner that is not the controller", ns: "istio-system", pod: podName, wantRead: true, objects: []*corev1.Pod{owned(
			metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: dsName, UID: "ds-uid"})}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kube := fake.NewClientset()
			for _, p := range tt.objects {
				if _, err := kube.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			kube.ClearActions()
			w := removal.New(kube, tt.ns, tt.pod, slog.New(slog.DiscardHandler))
			run(t, w)
			if tt.wantRead {
				eventually(t, "own pod read", func() bool { return len(kube.Actions()) > 0 })
			}
			// Nothing to watch: the agent may be ready.
			eventually(t, "synced", func() bool { return closed(w.Synced()) })
			if removed, err := w.Removed(t.Context()); removed || err == nil {
				t.Errorf("Removed() = %v, %v; want false with an error (stay installed)", removed, err)
			}
			for _, a := range kube.Actions() {
				if a.GetResource().Resource != "pods" || a.GetVerb() != "get" {
					t.Errorf("unexpected API call %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
		})
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return f(), nil })
	if err != nil {
		t.Fatalf("timed out waiting until %s", what)
	}
}

// agentNode is an agent's namespace on the test API server: its
// DaemonSet, its pod, and its RBAC (the chart's: read the own pod, watch
// the DaemonSet).
type agentNode struct {
	ns string
	ds *appsv1.DaemonSet
	// kube is the agent's client, as its service account; listed is
	// closed once the agent has listed or started watching DaemonSets.
	kube   kubernetes.Interface
	listed chan struct{}
}

func setUp(t *testing.T) *agentNode {
	t.Helper()
	testenv.Need(t, env)
	ctx := t.Context()
	a := &agentNode{ns: env.Namespace(t, "removal", nil), listed: make(chan struct{})}
	admin := env.Client
	if _, err := admin.CoreV1().ServiceAccounts(a.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(a.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: agentSA}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(a.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: agentSA},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: agentSA},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentSA, Namespace: a.ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.ds = a.createDaemonSet(t)
	if _, err := admin.CoreV1().Pods(a.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, OwnerReferences: []metav1.OwnerReference{
			*metav1.NewControllerRef(a.ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}, Labels: map[string]string{"app": dsName}},
		Spec: corev1.PodSpec{ServiceAccountName: agentSA, Containers: []corev1.Container{{Name: "agent", Image: "canopy/cni-agent"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tok, err := env.Token(ctx, a.ns, agentSA, testenv.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := env.ConfigWithToken(tok)
	var once sync.Once
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			// A list, or a watch the server accepted: any change after
			// this reaches the informer.
			if err == nil && resp.StatusCode == http.StatusOK && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/daemonsets") {
				once.Do(func() { close(a.listed) })
			}
			return resp, err
		})
	})
	if a.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return a
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (a *agentNode) createDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	lbls := map[string]string{"app": dsName}
	ds, err := env.Client.AppsV1().DaemonSets(a.ns).Create(t.Context(), &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: dsName},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: lbls}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: lbls},
			Spec:       corev1.PodSpec{ServiceAccountName: agentSA, Containers: []corev1.Container{{Name: "agent", Image: "canopy/cni-agent:1"}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func (a *agentNode) deleteDaemonSet(t *testing.T, policy metav1.DeletionPropagation) {
	t.Helper()
	if err := env.Client.AppsV1().DaemonSets(a.ns).Delete(t.Context(), dsName, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
		t.Fatal(err)
	}
}

// revokeRBAC deletes the agent's RoleBinding, as an uninstall that deletes
// everything at once does, and waits until the agent can no longer read
// the DaemonSet: from then on only the watch can tell.
func (a *agentNode) revokeRBAC(t *testing.T) {
	t.Helper()
	if err := env.Client.RbacV1().RoleBindings(a.ns).Delete(t.Context(), agentSA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "RBAC revoked", func() bool {
		_, err := a.kube.AppsV1().DaemonSets(a.ns).Get(t.Context(), dsName, metav1.GetOptions{})
		return apierrors.IsForbidden(err)
	})
}

// TestWatch: the watch started while the agent runs tells an uninstall
// (the DaemonSet deleted, being deleted or replaced) from an upgrade (the
// DaemonSet updated), even after the agent's RBAC is gone.
func TestWatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		change func(t *testing.T, a *agentNode)
		want   bool
	}{
		{
			name:   "deleted",
			change: func(t *testing.T, a *agentNode) { a.deleteDaemonSet(t, metav1.DeletePropagationBackground) },
			want:   true,
		},
		{
			name: "being deleted",
			change: func(t *testing.T, a *agentNode) {
				// A finalizer holds the DaemonSet in deletion.
				a.patchDaemonSet(t, `{"metadata":{"finalizers":["test.canopy.dev/hold"]}}`)
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_, _ = env.Client.AppsV1().DaemonSets(a.ns).Patch(ctx, dsName, types.MergePatchType,
						[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				})
				a.deleteDaemonSet(t, metav1.DeletePropagationOrphan)
			},
			want: true,
		},
		{
			name: "replaced",
			change: func(t *testing.T, a *agentNode) {
				a.deleteDaemonSet(t, metav1.DeletePropagationBackground)
				eventually(t, "DaemonSet gone", func() bool {
					_, err := env.Client.AppsV1().DaemonSets(a.ns).Get(t.Context(), dsName, metav1.GetOptions{})
					return apierrors.IsNotFound(err)
				})
				a.createDaemonSet(t)
			},
			want: true,
		},
		{
			name: "upgraded",
			change: func(t *testing.T, a *agentNode) {
				a.patchDaemonSet(t, `{"spec":{"template":{"spec":{"containers":[{"name":"agent","image":"canopy/cni-agent:2"}]}}}}`)
				a.patchDaemonSet(t, `{"metadata":{"annotations":{"deprecated.daemonset.template.generation":"2"}}}`)
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := setUp(t)
			w := removal.New(a.kube, a.ns, podName, slog.New(slog.DiscardHandler))
			run(t, w)
			select {
			case <-w.Synced():
			case <-time.After(30 * time.Second):
				t.Fatal("the watch never synced")
			}
			if !closed(a.listed) {
				t.Fatal("synced before the agent listed its DaemonSet")
			}
			if removed, err := w.Removed(t.Context()); removed || err != nil {
				t.Fatalf("Removed() before any change = %v, %v; want false", removed, err)
			}
			tt.change(t, a)
			a.revokeRBAC(t)
			if !tt.want {
				// The updates were delivered before the RBAC change took
				// effect; an upgrade must not have been taken for removal.
				// Unanswered, Removed gives the watch until its context ends.
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				if removed, err := w.Removed(ctx); removed || err == nil {
					t.Errorf("Removed() after an upgrade = %v, %v; want false with an error (nothing can be asked)", removed, err)
				}
				return
			}
			eventually(t, "the watch sees the removal", func() bool {
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				defer cancel()
				removed, _ := w.Removed(ctx)
				return removed
			})
		})
	}
}

func (a *agentNode) patchDaemonSet(t *testing.T, patch string) {
	t.Helper()
	if _, err := env.Client.AppsV1().DaemonSets(a.ns).Patch(t.Context(), dsName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRemovedAsksWithoutWatch: when the watch has not seen the removal (the
// agent stopped right away), Removed asks the API server.
func TestRemovedAsksWithoutWatch(t *testing.T) {
	t.Parallel()
	a := setUp(t)
	w := removal.New(a.kube, a.ns, podName, slog.New(slog.DiscardHandler))
	// Only the pod read: the watch is not running, as when the API server
	// refuses it.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-a.listed:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never listed its DaemonSet")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if removed, err := w.Removed(t.Context()); removed || err != nil {
		t.Fatalf("Removed() = %v, %v; want false", removed, err)
	}
	a.deleteDaemonSet(t, metav1.DeletePropagationOrphan)
	if removed, err := w.Removed(t.Context()); !removed || err != nil {
		t.Errorf("Removed() after deletion = %v, %v; want true", removed, err)
	}
}
