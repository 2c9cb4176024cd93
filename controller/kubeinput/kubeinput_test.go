package kubeinput_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/kubeinput"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// settle is how long a condition of these tests may take to become true.
const settle = 20 * time.Second

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// recorder keeps every change set the watcher emits.
type recorder struct {
	mu   sync.Mutex
	sets []index.ChangeSet
}

func (r *recorder) add(cs index.ChangeSet) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, cs)
}

// saw reports whether some change set listed name under the kind of change.
func (r *recorder) saw(kind string, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cs := range r.sets {
		var list []string
		switch kind {
		case "added":
			list = cs.Addresses.Added
		case "updated":
			list = cs.Addresses.Updated
		case "removed":
			list = cs.Addresses.Removed
		case "auth-added":
			list = cs.Authorizations.Added
		}
		if slices.Contains(list, name) {
			return true
		}
	}
	return false
}

// TestWatcherConverges drives the index through a real API server: create,
// update, relabel and delete, and checks both the tables and the change
// sets the watcher emits.
func TestWatcherConverges(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gatewayclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	x := index.New(ambient.Config{})
	var rec recorder
	w := kubeinput.New(kubeinput.Clients{Kube: env.Client, Istio: istio, Gateway: gw}, x, rec.add, slog.New(slog.DiscardHandler))
	runSynced(t, w)

	ns := env.Namespace(t, "tables", nil)
	c := env.Client
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Labels: map[string]string{"app": "echo"},
			Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "echo", Image: "canopy/echo",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := workloadapi.PodUID("Kubernetes", ns, pod.Name)
	status, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.244.9.9", PodIPs: []corev1.PodIP{{IP: "10.244.9.9"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}})
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "pod workload published", func() bool {
		return x.Address(uid).GetWorkload().GetStatus() == workloadapi.WorkloadStatus_HEALTHY && rec.saw("added", uid)
	})

	svcKey := workloadapi.ServiceKey(ns, "echo."+ns+".svc.cluster.local")
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "service published and pod's services map updated", func() bool {
		pl := x.Address(uid).GetWorkload().GetServices()[svcKey]
		return x.Address(svcKey) != nil && len(pl.GetPorts()) == 1 && pl.GetPorts()[0].GetTargetPort() == 8080 &&
			rec.saw("added", svcKey) && rec.saw("updated", uid)
	})

	pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-echo"}}
	pol.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}}
	pol.Spec.Rules = []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{ns}}}}}}
	if _, err := istio.SecurityV1().AuthorizationPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "policy published and listed on the workload", func() bool {
		return x.Authorization(ns+"/allow-echo") != nil && rec.saw("auth-added", ns+"/allow-echo") &&
			slices.Contains(x.Address(uid).GetWorkload().GetAuthorizationPolicies(), ns+"/allow-echo")
	})

	relabel, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": "other"}}})
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, relabel, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "relabelled pod leaves the service and the policy", func() bool {
		wl := x.Address(uid).GetWorkload()
		return wl != nil && wl.GetServices()[svcKey] == nil && len(wl.GetAuthorizationPolicies()) == 0
	})

	if err := c.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "deleted pod removed", func() bool { return x.Address(uid) == nil && rec.saw("removed", uid) })
}

// slowPods is an index whose pod events of one namespace wait, each for
// at most hold, until the watcher reports itself synced. It records the
// pods applied after that: a watcher that says it is synced while its
// handlers still hold initial events would have the controller build its
// first table without them.
type slowPods struct {
	*index.Index
	ns     string
	hold   time.Duration
	synced func() <-chan struct{}

	mu   sync.Mutex
	late []string
}

func (s *slowPods) UpsertPod(p *corev1.Pod) index.ChangeSet {
	if p.Namespace == s.ns {
		timer := time.NewTimer(s.hold)
		defer timer.Stop()
		select {
		case <-s.synced():
			s.mu.Lock()
			s.late = append(s.late, p.Name)
			s.mu.Unlock()
		case <-timer.C:
		}
	}
	return s.Index.UpsertPod(p)
}

// TestSyncedMeansApplied: Synced closes only once the handlers have
// applied every object of the initial lists to the index, however slowly
// they apply them, not when the informers' caches are filled.
func TestSyncedMeansApplied(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gatewayclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "slow", nil)
	const pods = 3
	for i := range pods {
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"}},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	x := &slowPods{Index: index.New(ambient.Config{}), ns: ns, hold: time.Second}
	w := kubeinput.New(kubeinput.Clients{Kube: env.Client, Istio: istio, Gateway: gw}, x, nil, slog.New(slog.DiscardHandler))
	x.synced = w.Synced
	runSynced(t, w)
	var missing []string
	for i := range pods {
		if x.Pod(ns, fmt.Sprintf("p%d", i)) == nil {
			missing = append(missing, fmt.Sprintf("p%d", i))
		}
	}
	x.mu.Lock()
	late := x.late
	x.mu.Unlock()
	if len(missing) > 0 || len(late) > 0 {
		t.Errorf("at Synced the index lacked pods %q; pods applied after Synced: %q", missing, late)
	}
}

// runSynced runs w until the test ends and waits for its first sync.
func runSynced(t *testing.T, w *kubeinput.Watcher) {
	t.Helper()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-w.Synced():
	case err := <-done:
		t.Fatalf("watcher ended before sync: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("informers did not sync")
	}
}
