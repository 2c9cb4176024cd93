package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/deploy/charts"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/kubeapply"
)

// InstallOptions are canopyctl install's flags.
type InstallOptions struct {
	Namespace string
	// Version is the image tag and chart appVersion.
	Version     string
	ValuesFiles []string
	Set         []string
	SkipCRDs    bool
	// ForceCRDs takes over CRD fields another manager (Istio's installer,
	// the Gateway API's) owns; without it such a CRD is an error.
	ForceCRDs bool
	// DryRun prints the manifests instead of applying them.
	DryRun bool
	// Wait bounds the wait for readiness; zero does not wait.
	Wait time.Duration
	// Revision, when set, installs a control-plane revision beside the
	// default one (the chart's revision value): only its controller,
	// named and labelled for it; see CheckRevision.
	Revision string
}

// Check checks the options without a cluster.
func (o InstallOptions) Check() error {
	if o.SkipCRDs && o.ForceCRDs {
		return errors.New("--skip-crds and --force-crds: pass one or the other")
	}
	return CheckRevision(o.Revision)
}

// RenderChart renders the embedded chart with the options' values.
func RenderChart(opts InstallOptions) (*chart.Rendered, error) {
	vals := map[string]any{}
	for _, f := range opts.ValuesFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("values file: %w", err)
		}
		v, err := chart.ParseValues(b)
		if err != nil {
			return nil, fmt.Errorf("values file %s: %w", f, err)
		}
		vals = mergeValues(vals, v)
	}
	set := opts.Set
	if opts.Revision != "" {
		// Last, so that the flag wins over a values file or --set.
		set = append(slices.Clone(set), "revision="+opts.Revision)
	}
	return chart.Render(charts.Canopy(), chart.Options{Namespace: opts.Namespace, Version: opts.Version, Values: vals, Set: set})
}

// Install renders the chart, applies it and waits until the controller
// and every DaemonSet pod are ready, printing progress to w. On a release
// that is already installed it applies everything at once, saying that
// canopyctl upgrade rolls one component at a time. A revision's install
// waits only for its own controller.
func Install(ctx context.Context, c *cluster.Cluster, opts InstallOptions, w io.Writer) error {
	if err := opts.Check(); err != nil {
		return err
	}
	r, err := RenderChart(opts)
	if err != nil {
		return err
	}
	if opts.DryRun {
		return printManifests(w, r, opts.SkipCRDs)
	}
	if err := ensureNamespace(ctx, c, opts.Namespace); err != nil {
		return err
	}
	if name, ok := controllerDeployment(r); ok {
		_, err := c.Client.AppsV1().Deployments(opts.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			fmt.Fprintf(w, "%s is already installed in namespace %s: applying every component at once (canopyctl upgrade%s rolls them one at a time, the controller first)\n",
				name, opts.Namespace, revisionFlag(r))
		}
	}
	a, err := kubeapply.New(c.Config, kubeapply.Options{})
	if err != nil {
		return err
	}
	if !opts.SkipCRDs {
		fmt.Fprintf(w, "applying %d CRDs\n", len(r.CRDs))
		if err := applyCRDs(ctx, c, r, opts.ForceCRDs); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "applying %d objects to namespace %s\n", len(r.Objects), opts.Namespace)
	if err := a.Apply(ctx, r.Objects); err != nil {
		return err
	}
	if opts.Wait <= 0 {
		return nil
	}
	if revisionOf(r) != "" {
		// The default release's components are not this install's to
		// wait for.
		rollouts := PlanUpgrade(r, true, true)[0].Rollouts
		if err := waitRollouts(ctx, c, opts.Namespace, rollouts, opts.Wait, w); err != nil {
			return fmt.Errorf("not ready: %w", err)
		}
		fmt.Fprintf(w, "revision %s is ready\n", revisionOf(r))
		return nil
	}
	return WaitReady(ctx, c, opts.Namespace, opts.Wait, w)
}

// applyCRDs applies the chart's CRDs without taking over what another
// installer manages: on a cluster where Istio or the Gateway API put them,
// their schema stays theirs unless the user says otherwise.
func applyCRDs(ctx context.Context, c *cluster.Cluster, r *chart.Rendered, force bool) error {
	a, err := kubeapply.New(c.Config, kubeapply.Options{NoForce: !force})
	if err != nil {
		return err
	}
	if err := a.Apply(ctx, r.CRDs); err != nil {
		if kubeapply.IsConflict(err) {
			return fmt.Errorf("%w\nanother installer manages this CRD: pass --skip-crds to leave the CRDs as they are, or --force-crds to take them over", err)
		}
		return err
	}
	return nil
}

// WaitReady waits until every Deployment and DaemonSet of Canopy in
// namespace has all its pods updated and ready, printing a line whenever
// the picture changes. On timeout it says which pods are not ready, and
// why as far as their status tells.
func WaitReady(ctx context.Context, c *cluster.Cluster, namespace string, timeout time.Duration, w io.Writer) error {
	last := ""
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		line, done, err := readiness(ctx, c, namespace)
		if err != nil {
			// Transient (an API server hiccup, the timeout itself): keep
			// polling and say so; the timeout reports what is not ready.
			line = "(" + err.Error() + ")"
		}
		if line != last {
			fmt.Fprintf(w, "  %s\n", line)
			last = line
		}
		return done, nil
	})
	if err == nil {
		fmt.Fprintln(w, "Canopy is ready")
		return nil
	}
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err)) {
		return fmt.Errorf("not ready after %s:\n%s", timeout, notReadyReport(context.WithoutCancel(ctx), c, namespace, "app.kubernetes.io/part-of=canopy"))
	}
	return err
}

// readiness summarizes Canopy's workloads: "canopy-controller 1/1 ready ·
// canopy-cni-agent 2/2 nodes · canopy-node 1/2 nodes".
func readiness(ctx context.Context, c *cluster.Cluster, ns string) (string, bool, error) {
	deps, err := c.Client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=canopy"})
	if err != nil {
		return "", false, fmt.Errorf("list Deployments: %w", err)
	}
	dss, err := c.Client.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=canopy"})
	if err != nil {
		return "", false, fmt.Errorf("list DaemonSets: %w", err)
	}
	if len(deps.Items) == 0 && len(dss.Items) == 0 {
		return "", false, fmt.Errorf("no Canopy Deployment or DaemonSet in namespace %s: run canopyctl install", ns)
	}
	var parts []string
	done := true
	for _, d := range deps.Items {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		ok := deploymentReady(&d, want)
		done = done && ok
		parts = append(parts, fmt.Sprintf("%s %d/%d ready", d.Name, d.Status.ReadyReplicas, want))
	}
	for _, d := range dss.Items {
		ok := daemonSetReady(&d)
		done = done && ok
		parts = append(parts, fmt.Sprintf("%s %d/%d nodes", d.Name, d.Status.NumberReady, d.Status.DesiredNumberScheduled))
	}
	return strings.Join(parts, " · "), done, nil
}

func deploymentReady(d *appsv1.Deployment, want int32) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
		d.Status.ReadyReplicas == want && d.Status.Replicas == want
}

func daemonSetReady(d *appsv1.DaemonSet) bool {
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.DesiredNumberScheduled > 0 &&
		s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberReady == s.DesiredNumberScheduled
}

// notReadyReport lists the pods of ns that selector selects and that are
// not ready, with the reason their status gives.
func notReadyReport(ctx context.Context, c *cluster.Cluster, ns, selector string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return "  (cannot list pods: " + err.Error() + ")"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		if cluster.Ready(&p) {
			continue
		}
		fmt.Fprintf(&b, "  %s on %s: %s (kubectl -n %s logs %s)\n", p.Name, orNone(p.Spec.NodeName), podProblem(&p), ns, p.Name)
	}
	if b.Len() == 0 {
		return "  every pod is ready; a rollout is still in progress"
	}
	return b.String()
}

func podProblem(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			return fmt.Sprintf("%s: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			return fmt.Sprintf("%s: exited %d (%s)", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
		case !cs.Ready:
			return fmt.Sprintf("%s: running, readiness probe failing (restarts %d)", cs.Name, cs.RestartCount)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return c.Message
		}
	}
	return string(p.Status.Phase)
}

// UninstallOptions are canopyctl uninstall's flags.
type UninstallOptions struct {
	Namespace string
	// RemoveCRDs also deletes the CRDs, and with them every Istio
	// resource in the cluster; off by default.
	RemoveCRDs bool
	// Purge also deletes what the controller made at run time: the
	// self-signed CA (istio-ca-secret; a plug-in CA's cacerts is the
	// user's and stays) and the root-certificate ConfigMaps it published
	// in every namespace. Without it a reinstall keeps the mesh's root.
	Purge bool
	// Wait bounds the wait for the CNI agents to un-enroll their pods;
	// zero does not wait (their pods may still be enrolled when the node
	// proxies go).
	Wait time.Duration
	// Revision, when set, removes only that revision's control plane
	// (see InstallOptions.Revision), leaving the default release and
	// every other revision.
	Revision string
}

// Check checks the options without a cluster.
func (o UninstallOptions) Check() error {
	if err := CheckRevision(o.Revision); err != nil {
		return err
	}
	if o.Revision != "" && (o.Purge || o.RemoveCRDs) {
		return fmt.Errorf("uninstall --revision %s: --purge and --remove-crds remove what every revision shares; they go with the default release (canopyctl uninstall)", o.Revision)
	}
	return nil
}

// Uninstall removes Canopy. The CNI agents go first: deleting their
// DaemonSet makes each take its node's pods out of the mesh (rules, node
// proxy, annotations) while the node proxies and RBAC still exist; then
// the rest of the chart is deleted.
//
// With a Revision it deletes only that revision's control plane, and
// refuses while the node proxies use its controller.
func Uninstall(ctx context.Context, c *cluster.Cluster, opts UninstallOptions, w io.Writer) error {
	if err := opts.Check(); err != nil {
		return err
	}
	r, err := RenderChart(InstallOptions{Namespace: opts.Namespace, Revision: opts.Revision})
	if err != nil {
		return err
	}
	a, err := kubeapply.New(c.Config, kubeapply.Options{})
	if err != nil {
		return err
	}
	if opts.Revision != "" {
		return uninstallRevision(ctx, c, a, r, opts, w)
	}
	agents := slices.DeleteFunc(slices.Clone(r.Objects), func(o *unstructured.Unstructured) bool {
		return o.GetKind() != "DaemonSet" || o.GetName() != cluster.CNIAgentApp
	})
	fmt.Fprintln(w, "taking pods out of the mesh: deleting the CNI agents")
	if err := a.Delete(ctx, agents); err != nil {
		return err
	}
	if opts.Wait > 0 {
		err = wait.PollUntilContextTimeout(ctx, time.Second, opts.Wait, true, func(ctx context.Context) (bool, error) {
			pods, err := c.Client.CoreV1().Pods(opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.Selector(cluster.CNIAgentApp)})
			// A failed list is retried: giving up here would leave the
			// agents gone and the rest of Canopy half deleted.
			return err == nil && len(pods.Items) == 0, nil
		})
		if err != nil {
			return fmt.Errorf("CNI agents still running after %s (their nodes' pods may still be enrolled; run canopyctl uninstall again): %w", opts.Wait, err)
		}
	}
	fmt.Fprintf(w, "deleting the rest of Canopy from namespace %s\n", opts.Namespace)
	if err := a.Delete(ctx, r.Objects); err != nil {
		return err
	}
	if opts.Purge {
		// A controller still stopping would publish the ConfigMaps again.
		err := wait.PollUntilContextTimeout(ctx, time.Second, max(opts.Wait, 30*time.Second), true, func(ctx context.Context) (bool, error) {
			pods, err := c.Client.CoreV1().Pods(opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.Selector(cluster.ControllerApp)})
			return err == nil && len(pods.Items) == 0, nil
		})
		if err != nil {
			return fmt.Errorf("canopy-controller still running; not purging: %w", err)
		}
		if err := purge(ctx, c, opts.Namespace, w); err != nil {
			return err
		}
	}
	if opts.RemoveCRDs {
		fmt.Fprintln(w, "deleting the CRDs")
		if err := a.Delete(ctx, r.CRDs); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "Canopy is uninstalled")
	if revs := otherRevisions(ctx, c, opts.Namespace); len(revs) > 0 {
		fmt.Fprintf(w, "controllers of other revisions are still installed: %s (canopyctl uninstall --revision <revision>)\n", strings.Join(revs, ", "))
	}
	return nil
}

// uninstallRevision deletes a revision's control plane, r.
func uninstallRevision(ctx context.Context, c *cluster.Cluster, a *kubeapply.Applier, r *chart.Rendered, opts UninstallOptions, w io.Writer) error {
	name, _ := controllerDeployment(r)
	ds, err := c.Client.AppsV1().DaemonSets(opts.Namespace).Get(ctx, nodeProxyDaemonSet, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get DaemonSet %s/%s (whose controller the node proxies use): %w", opts.Namespace, nodeProxyDaemonSet, err)
	case usesController(ds, name):
		return fmt.Errorf("the node proxies use revision %s's controller: move them back first (canopyctl upgrade --set node.controllerRevision=), then uninstall it", opts.Revision)
	}
	fmt.Fprintf(w, "deleting revision %s (%s) from namespace %s\n", opts.Revision, name, opts.Namespace)
	if err := a.Delete(ctx, r.Objects); err != nil {
		return err
	}
	fmt.Fprintf(w, "revision %s is uninstalled\n", opts.Revision)
	return nil
}

// nodeProxyDaemonSet is the node proxy's DaemonSet, named as Istio's.
const nodeProxyDaemonSet = "ztunnel"

// usesController reports whether the node proxy's DaemonSet points its
// proxies at the controller Service named controller.
func usesController(ds *appsv1.DaemonSet, controller string) bool {
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		for _, e := range ctr.Env {
			if (e.Name == "XDS_ADDRESS" || e.Name == "CA_ADDRESS") && strings.HasPrefix(e.Value, controller+".") {
				return true
			}
		}
	}
	return false
}

// otherRevisions lists the revisions whose controllers remain in ns: best
// effort, for a hint after the default release is gone.
func otherRevisions(ctx context.Context, c *cluster.Cluster, ns string) []string {
	deps, err := c.Client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: cluster.Selector(cluster.ControllerApp)})
	if err != nil {
		return nil
	}
	var revs []string
	for _, d := range deps.Items {
		if rev := d.Spec.Template.Labels[revisionLabel]; rev != "" && rev != "default" && d.DeletionTimestamp == nil {
			revs = append(revs, rev)
		}
	}
	slices.Sort(revs)
	return revs
}

// purge deletes the controller's run-time objects (see Purge).
func purge(ctx context.Context, c *cluster.Cluster, ns string, w io.Writer) error {
	cms, err := c.Client.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=canopy-controller"})
	if err != nil {
		return fmt.Errorf("list the root-certificate ConfigMaps: %w", err)
	}
	for _, cm := range cms.Items {
		err := c.Client.CoreV1().ConfigMaps(cm.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
	}
	err = c.Client.CoreV1().Secrets(ns).Delete(ctx, selfSignedCASecret, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the self-signed CA %s/%s: %w", ns, selfSignedCASecret, err)
	}
	fmt.Fprintf(w, "deleted the self-signed CA and %d root-certificate ConfigMaps\n", len(cms.Items))
	return nil
}

// selfSignedCASecret is where the controller keeps a self-signed root
// (ca/rootstore; canopyctl does not link the CA).
const selfSignedCASecret = "istio-ca-secret"

func ensureNamespace(ctx context.Context, c *cluster.Cluster, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

func printManifests(w io.Writer, r *chart.Rendered, skipCRDs bool) error {
	objs := r.Objects
	if !skipCRDs {
		objs = append(slices.Clone(r.CRDs), objs...)
	}
	for _, o := range objs {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

// mergeValues merges b over a, recursing into maps (as helm merges values
// files).
func mergeValues(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "<unscheduled>"
	}
	return s
}
