package ctl

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// fakeKubelet stands in for the kubelets and the DaemonSet controller,
// which the test environment does not run. For each released component
// (its app.kubernetes.io/name) it marks the component's pods ready, which
// the ReplicaSet and Deployment controllers then count, and writes its
// DaemonSets' status as rolled out on two nodes. A held component's new
// pods stay pending and its DaemonSets' new specs unobserved: its rollout
// never finishes.
type fakeKubelet struct {
	client kubernetes.Interface
	ns     string

	mu       sync.Mutex
	released map[string]bool
}

// startFakeKubelet runs a fakeKubelet with every component held until the
// test ends.
func startFakeKubelet(t *testing.T, client kubernetes.Interface, ns string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{client: client, ns: ns, released: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			k.tick(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return k
}

// release lets the components' rollouts finish; none holds every one.
func (k *fakeKubelet) release(apps ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, a := range apps {
		k.released[a] = true
	}
}

func (k *fakeKubelet) hold() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.released)
}

func (k *fakeKubelet) isReleased(app string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.released[app]
}

// tick does one round; failures (conflicts, a cancelled context) are
// left for the next.
func (k *fakeKubelet) tick(ctx context.Context) {
	pods, err := k.client.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		if !k.isReleased(p.Labels[cluster.ComponentLabel]) || cluster.Ready(&p) {
			continue
		}
		p := p.DeepCopy() // NEVER modify a listed object in place
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		_, _ = k.client.CoreV1().Pods(k.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	}
	dss, err := k.client.AppsV1().DaemonSets(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, d := range dss.Items {
		if !k.isReleased(d.Spec.Template.Labels[cluster.ComponentLabel]) || d.Status.ObservedGeneration == d.Generation {
			continue
		}
		d := d.DeepCopy()
		d.Status.ObservedGeneration = d.Generation
		d.Status.DesiredNumberScheduled, d.Status.CurrentNumberScheduled, d.Status.UpdatedNumberScheduled = 2, 2, 2
		d.Status.NumberReady, d.Status.NumberAvailable = 2, 2
		_, _ = k.client.AppsV1().DaemonSets(k.ns).UpdateStatus(ctx, d, metav1.UpdateOptions{})
	}
}

// installed installs Canopy 1.0.0 (injection off: the webhook
// configuration is cluster-wide and these tests run in parallel) into a
// new namespace, waits until it is ready, and holds every component.
func installed(t *testing.T) (string, *cluster.Cluster, *fakeKubelet) {
	t.Helper()
	testenv.Need(t, env)
	ns := env.Namespace(t, "upgrade", nil)
	c := &cluster.Cluster{Config: env.Config, Client: env.Client}
	k := startFakeKubelet(t, env.Client, ns)
	opts := InstallOptions{Namespace: ns, Version: "1.0.0", SkipCRDs: true, Set: []string{"injection.enabled=false"}}
	if err := Install(t.Context(), c, opts, io.Discard); err != nil {
		t.Fatalf("install: %v", err)
	}
	t.Cleanup(func() {
		// The ClusterRoles outlive the namespace.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := Uninstall(ctx, c, UninstallOptions{Namespace: ns}, io.Discard); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	k.release(cluster.ControllerApp, cluster.CNIAgentApp, cluster.NodeProxyApp)
	if err := WaitReady(t.Context(), c, ns, 30*time.Second, io.Discard); err != nil {
		t.Fatalf("the first install: %v", err)
	}
	k.hold()
	return ns, c, k
}

// upgradeTo is an upgrade of installed's release to version.
func upgradeTo(ns, version string, wait time.Duration, allAtOnce bool) UpgradeOptions {
	return UpgradeOptions{AllAtOnce: allAtOnce, InstallOptions: InstallOptions{
		Namespace: ns, Version: version, SkipCRDs: true, Set: []string{"injection.enabled=false"}, Wait: wait}}
}

// images returns the image tag of the controller, the CNI agent and the
// node proxy.
func images(t *testing.T, ns string) [3]string {
	t.Helper()
	tag := func(spec corev1.PodSpec) string {
		_, tag, _ := strings.Cut(spec.Containers[0].Image, ":")
		return tag
	}
	var out [3]string
	d, err := env.Client.AppsV1().Deployments(ns).Get(t.Context(), "canopy-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out[0] = tag(d.Spec.Template.Spec)
	for i, name := range []string{"canopy-cni-agent", "ztunnel"} {
		ds, err := env.Client.AppsV1().DaemonSets(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[i+1] = tag(ds.Spec.Template.Spec)
	}
	return out
}

// result waits for an upgrade's error.
func result(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the upgrade did not return within a minute")
		return nil
	}
}

// inOrder fails unless each of want occurs in out, in this order.
func inOrder(t *testing.T, out string, want ...string) {
	t.Helper()
	at := 0
	for _, w := range want {
		i := strings.Index(out[at:], w)
		if i < 0 {
			t.Fatalf("output lacks %q after byte %d:\n%s", w, at, out)
		}
		at += i + len(w)
	}
}

// TestUpgradeRollsInOrder: the controller's rollout finishes before the
// CNI agent's spec changes, and the CNI agent's before the node proxy's.
func TestUpgradeRollsInOrder(t *testing.T) {
	t.Parallel()
	ns, c, k := installed(t)
	var out strings.Builder
	errc := make(chan error, 1)
	go func() { errc <- Upgrade(t.Context(), c, upgradeTo(ns, "2.0.0", 30*time.Second, false), &out) }()

	for _, stage := range []struct {
		app  string
		want [3]string
	}{
		{cluster.ControllerApp, [3]string{"2.0.0", "1.0.0", "1.0.0"}},
		{cluster.CNIAgentApp, [3]string{"2.0.0", "2.0.0", "1.0.0"}},
		{cluster.NodeProxyApp, [3]string{"2.0.0", "2.0.0", "2.0.0"}},
	} {
		// The component's new spec is applied, and nothing after it
		// changes until the fake kubelet lets its rollout finish.
		eventually.Within(t, 30*time.Second, "only the components up to "+stage.app+" applied", func() bool {
			return images(t, ns) == stage.want
		})
		k.release(stage.app)
	}
	if err := result(t, errc); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out.String())
	}
	t.Logf("canopyctl upgrade:\n%s", out.String())
	inOrder(t, out.String(),
		"step 1 of 3: controller: applying 10 objects\n",
		"  controller (Deployment canopy-controller): ",
		"  controller (Deployment canopy-controller): 2/2 updated, 2/2 available\n",
		"step 2 of 3: CNI agent: applying 6 objects\n",
		"  CNI agent (DaemonSet canopy-cni-agent): 2/2 nodes updated, 2/2 available\n",
		"step 3 of 3: node proxy: applying 2 objects\n",
		"  node proxy (DaemonSet ztunnel): 2/2 nodes updated, 2/2 available\n",
		"Canopy is upgraded\n")
}

// TestUpgradeStopsAtStuckStep: a controller whose new pod never becomes
// ready stops the upgrade at its step, with its pending pod named, and
// leaves the node components as they were.
func TestUpgradeStopsAtStuckStep(t *testing.T) {
	t.Parallel()
	ns, c, _ := installed(t)
	var out strings.Builder
	err := Upgrade(t.Context(), c, upgradeTo(ns, "2.0.0", 3*time.Second, false), &out)
	if err == nil {
		t.Fatalf("the upgrade of a controller that never gets ready succeeded:\n%s", out.String())
	}
	msg := err.Error()
	t.Logf("canopyctl upgrade:\n%s%s", out.String(), msg)
	for _, want := range []string{
		"upgrade stopped at step 1 of 3 (controller); the later steps were not applied: controller: Deployment canopy-controller not rolled out after 3s (",
		"its pods:\n  canopy-controller-",
		" on <unscheduled>: Pending (kubectl -n " + ns + " logs canopy-controller-",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if got, want := images(t, ns), [3]string{"2.0.0", "1.0.0", "1.0.0"}; got != want {
		t.Errorf("images after the stopped upgrade %v, want %v", got, want)
	}
}

// TestUpgradeAllAtOnce: every component's new spec is applied before any
// rollout finishes, and the upgrade returns once all have.
func TestUpgradeAllAtOnce(t *testing.T) {
	t.Parallel()
	ns, c, k := installed(t)
	var out strings.Builder
	errc := make(chan error, 1)
	go func() { errc <- Upgrade(t.Context(), c, upgradeTo(ns, "2.0.0", 30*time.Second, true), &out) }()
	eventually.Within(t, 30*time.Second, "every component applied while none has rolled out", func() bool {
		return images(t, ns) == [3]string{"2.0.0", "2.0.0", "2.0.0"}
	})
	k.release(cluster.ControllerApp, cluster.CNIAgentApp, cluster.NodeProxyApp)
	if err := result(t, errc); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out.String())
	}
	inOrder(t, out.String(), "step 1 of 1: every component at once: applying 18 objects\n", "Canopy is upgraded\n")
}

// TestUpgradeNotInstalled: upgrade does not install.
func TestUpgradeNotInstalled(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ns := env.Namespace(t, "upgrade", nil)
	c := &cluster.Cluster{Config: env.Config, Client: env.Client}
	err := Upgrade(t.Context(), c, upgradeTo(ns, "2.0.0", time.Second, false), io.Discard)
	if want := "upgrade: no Deployment canopy-controller in namespace " + ns + ": install it first with canopyctl install"; err == nil || err.Error() != want {
		t.Errorf("upgrade of nothing: %v, want %q", err, want)
	}
}

// TestRevisionBesideDefault: install --revision canary adds a second
// controller and its injector beside the default release, waits only for
// that controller, and uninstall --revision canary removes only those,
// once the node proxies do not use it.
func TestRevisionBesideDefault(t *testing.T) {
	testenv.Need(t, env)
	// Not parallel: the default release's injector webhook configuration
	// is cluster-scoped, one name for every namespace, and the other
	// tests' installs and uninstalls would write and delete it meanwhile.
	ns := env.Namespace(t, "revision", nil)
	c := &cluster.Cluster{Config: env.Config, Client: env.Client}
	k := startFakeKubelet(t, env.Client, ns)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = Uninstall(ctx, c, UninstallOptions{Namespace: ns, Revision: "canary"}, io.Discard)
		if err := Uninstall(ctx, c, UninstallOptions{Namespace: ns}, io.Discard); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	install := func(rev string, wait time.Duration, set ...string) string {
		t.Helper()
		var out strings.Builder
		err := Install(t.Context(), c, InstallOptions{Namespace: ns, Version: "1.0.0", SkipCRDs: true, Revision: rev, Wait: wait, Set: set}, &out)
		if err != nil {
			t.Fatalf("install --revision %q: %v\n%s", rev, err, out.String())
		}
		return out.String()
	}
	install("", 0)
	if out := install("", 0); !strings.Contains(out, "canopy-controller is already installed in namespace "+ns+
		": applying every component at once (canopyctl upgrade rolls them one at a time, the controller first)\n") {
		t.Errorf("a second install does not point at upgrade:\n%s", out)
	}
	// The shared DaemonSets stay held: the revision's install must not
	// wait for them.
	k.release(cluster.ControllerApp)
	if out := install("canary", 30*time.Second); !strings.HasSuffix(out, "revision canary is ready\n") {
		t.Errorf("install --revision canary:\n%s", out)
	}

	apps := env.Client.AppsV1()
	d, err := apps.Deployments(ns).Get(t.Context(), "canopy-controller-canary", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rev := d.Spec.Template.Labels["istio.io/rev"]; rev != "canary" {
		t.Errorf("canary pods labelled istio.io/rev=%q", rev)
	}
	dss, err := apps.DaemonSets(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(dss.Items) != 2 {
		t.Errorf("%d DaemonSets (%v), want the default release's two", len(dss.Items), err)
	}
	hooks, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "istio-sidecar-injector-canary", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hooks.Webhooks {
		got = append(got, h.Name+" → "+h.ClientConfig.Service.Name+" "+metav1.FormatLabelSelector(h.NamespaceSelector)+" / "+metav1.FormatLabelSelector(h.ObjectSelector))
	}
	want := []string{
		"rev.namespace.sidecar-injector.istio.io → canopy-controller-canary !istio-injection,istio.io/rev in (canary),kubernetes.io/metadata.name notin (" + ns + ") / sidecar.istio.io/inject notin (false)",
		"rev.object.sidecar-injector.istio.io → canopy-controller-canary !istio-injection,!istio.io/rev,kubernetes.io/metadata.name notin (" + ns + ") / istio.io/rev in (canary),sidecar.istio.io/inject notin (false)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("canary webhooks (-want +got):\n%s", diff)
	}

	// Node proxies on the canary's controller keep it installed.
	install("", 0, "node.controllerRevision=canary")
	err = Uninstall(t.Context(), c, UninstallOptions{Namespace: ns, Revision: "canary"}, io.Discard)
	if want := "the node proxies use revision canary's controller: move them back first (canopyctl upgrade --set node.controllerRevision=), then uninstall it"; err == nil || err.Error() != want {
		t.Errorf("uninstall of the node proxies' revision: %v, want %q", err, want)
	}
	install("", 0)
	if err := Uninstall(t.Context(), c, UninstallOptions{Namespace: ns, Revision: "canary", Purge: true}, io.Discard); err == nil {
		t.Error("uninstall --revision --purge succeeded")
	}
	var out strings.Builder
	if err := Uninstall(t.Context(), c, UninstallOptions{Namespace: ns, Revision: "canary"}, &out); err != nil {
		t.Fatalf("uninstall --revision canary: %v\n%s", err, out.String())
	}

	gone := map[string]func() error{
		"Deployment canopy-controller-canary": func() error {
			_, err := apps.Deployments(ns).Get(t.Context(), "canopy-controller-canary", metav1.GetOptions{})
			return err
		},
		"ClusterRole canopy-controller-canary-" + ns: func() error {
			_, err := env.Client.RbacV1().ClusterRoles().Get(t.Context(), "canopy-controller-canary-"+ns, metav1.GetOptions{})
			return err
		},
		"MutatingWebhookConfiguration istio-sidecar-injector-canary": func() error {
			_, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "istio-sidecar-injector-canary", metav1.GetOptions{})
			return err
		},
	}
	for what, get := range gone {
		eventually.True(t, what+" deleted", func() bool { return apierrors.IsNotFound(get()) })
	}
	for _, get := range []func() error{
		func() error {
			_, err := apps.Deployments(ns).Get(t.Context(), "canopy-controller", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := apps.DaemonSets(ns).Get(t.Context(), "ztunnel", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "istio-sidecar-injector", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Errorf("the default release lost an object: %v", err)
		}
	}
}
