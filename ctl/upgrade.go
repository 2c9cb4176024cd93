package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/kubeapply"
)

// UpgradeOptions are canopyctl upgrade's flags: install's, where Wait
// bounds each step's rollout (the one wait of AllAtOnce) and must be
// positive, since the next step starts only once a step's rollout is done.
type UpgradeOptions struct {
	InstallOptions
	// AllAtOnce applies every component together and waits once, as
	// install does, instead of one component at a time.
	AllAtOnce bool
}

// component is one of Canopy's components: its ComponentLabel and what
// an upgrade calls it.
type component struct{ app, title string }

// upgradeOrder is the order an upgrade rolls the components in. The
// controller goes first: new node proxies and CNI agents then find a
// controller that already knows what they ask for, while old ones keep
// working against it. The CNI agent goes before the node proxy, which
// gets pods' network namespaces from it over ZDS.
func upgradeOrder() []component {
	return []component{
		{cluster.ControllerApp, "controller"},
		{cluster.CNIAgentApp, "CNI agent"},
		{cluster.NodeProxyApp, "node proxy"},
	}
}

// Check checks the options without a cluster.
func (o UpgradeOptions) Check() error {
	if err := o.InstallOptions.Check(); err != nil {
		return err
	}
	if o.Wait <= 0 {
		return fmt.Errorf("upgrade: --wait must be positive (got %s): each step waits for its rollout before the next starts", o.Wait)
	}
	return nil
}

// Step is one step of an upgrade: its objects are applied together, then
// its rollouts are waited for.
type Step struct {
	// Title names the step in the plan, progress lines and errors.
	Title string
	// CRDs marks the step of the CRDs, which are applied without taking
	// over another installer's fields (see InstallOptions.ForceCRDs).
	CRDs bool
	// Objects are applied in this order.
	Objects []*unstructured.Unstructured
	// Rollouts are the Deployments and DaemonSets among Objects.
	Rollouts []Rollout
}

// Rollout is a Deployment or DaemonSet an upgrade waits for.
type Rollout struct {
	// Component is the title of the workload's component.
	Component string
	Kind      string
	Name      string
	// Pods selects the workload's pods (and not another revision's), for
	// the report on the ones that are stuck.
	Pods string
}

// PlanUpgrade orders a rendered chart into an upgrade's steps: the CRDs
// (unless skipped), then objects of no known component, then the
// controller, the CNI agent and the node proxy, each with its own
// ServiceAccount, RBAC and Services. allAtOnce makes one step of every
// object after the CRDs. Steps without objects are left out, so that a
// revision's release (only a controller) plans the CRDs and its
// controller.
func PlanUpgrade(r *chart.Rendered, skipCRDs, allAtOnce bool) []Step {
	var steps []Step
	if !skipCRDs && len(r.CRDs) > 0 {
		steps = append(steps, Step{Title: "CRDs", CRDs: true, Objects: r.CRDs})
	}
	if allAtOnce {
		return append(steps, newStep("every component at once", r.Objects))
	}
	byApp := map[string][]*unstructured.Unstructured{}
	var other []*unstructured.Unstructured
	for _, o := range r.Objects {
		app := o.GetLabels()[cluster.ComponentLabel]
		if !slices.ContainsFunc(upgradeOrder(), func(c component) bool { return c.app == app }) {
			other = append(other, o)
			continue
		}
		byApp[app] = append(byApp[app], o)
	}
	if len(other) > 0 {
		steps = append(steps, newStep("shared objects", other))
	}
	for _, c := range upgradeOrder() {
		if objs := byApp[c.app]; len(objs) > 0 {
			steps = append(steps, newStep(c.title, objs))
		}
	}
	return steps
}

func newStep(title string, objs []*unstructured.Unstructured) Step {
	s := Step{Title: title, Objects: objs}
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		app := labels[cluster.ComponentLabel]
		title := app
		for _, c := range upgradeOrder() {
			if c.app == app {
				title = c.title
			}
		}
		pods := cluster.Selector(app)
		if rev := labels[revisionLabel]; rev != "" {
			pods += "," + revisionLabel + "=" + rev
		}
		s.Rollouts = append(s.Rollouts, Rollout{Component: title, Kind: o.GetKind(), Name: o.GetName(), Pods: pods})
	}
	return s
}

// revisionLabel is the control-plane revision of the controller's pods.
const revisionLabel = "istio.io/rev"

// Upgrade renders the chart and applies it step by step (PlanUpgrade),
// waiting after each step until its Deployments and DaemonSets have
// rolled out, printing progress to w. A step that does not finish within
// opts.Wait stops the upgrade, naming the component and its stuck pods;
// the later steps are not applied. With DryRun it prints the plan.
func Upgrade(ctx context.Context, c *cluster.Cluster, opts UpgradeOptions, w io.Writer) error {
	if err := opts.Check(); err != nil {
		return err
	}
	r, err := RenderChart(opts.InstallOptions)
	if err != nil {
		return err
	}
	steps := PlanUpgrade(r, opts.SkipCRDs, opts.AllAtOnce)
	if opts.DryRun {
		return printPlan(w, steps, revisionOf(r), opts)
	}
	controller, ok := controllerDeployment(r)
	if ok {
		_, err := c.Client.AppsV1().Deployments(opts.Namespace).Get(ctx, controller, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("upgrade: no Deployment %s in namespace %s: install it first with canopyctl install%s",
				controller, opts.Namespace, revisionFlag(r))
		}
		if err != nil {
			return fmt.Errorf("upgrade: get Deployment %s/%s: %w", opts.Namespace, controller, err)
		}
	}
	a, err := kubeapply.New(c.Config, kubeapply.Options{})
	if err != nil {
		return err
	}
	for i, s := range steps {
		fmt.Fprintf(w, "step %d of %d: %s: applying %d objects\n", i+1, len(steps), s.Title, len(s.Objects))
		if s.CRDs {
			err = applyCRDs(ctx, c, r, opts.ForceCRDs)
		} else {
			err = a.Apply(ctx, s.Objects)
		}
		if err != nil {
			return fmt.Errorf("upgrade step %d of %d (%s): %w", i+1, len(steps), s.Title, err)
		}
		if err := waitRollouts(ctx, c, opts.Namespace, s.Rollouts, opts.Wait, w); err != nil {
			later := ""
			if i+1 < len(steps) {
				later = "; the later steps were not applied"
			}
			return fmt.Errorf("upgrade stopped at step %d of %d (%s)%s: %w", i+1, len(steps), s.Title, later, err)
		}
	}
	fmt.Fprintln(w, "Canopy is upgraded")
	return nil
}

// waitRollouts polls the rollouts until each is done, printing a line for
// each whenever its progress changes, for at most timeout. On timeout the
// error names the first unfinished rollout and its pods that are not
// ready; a rollout the API server says failed ends the wait at once.
func waitRollouts(ctx context.Context, c *cluster.Cluster, ns string, rollouts []Rollout, timeout time.Duration, w io.Writer) error {
	if len(rollouts) == 0 {
		return nil
	}
	last := make([]string, len(rollouts))
	var pending *Rollout
	var pendingLine string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pending = nil
		for i := range rollouts {
			ro := &rollouts[i]
			line, done, err := rolloutOf(ctx, c, ns, ro)
			switch {
			case errors.Is(err, errRolloutFailed):
				return false, fmt.Errorf("%s %s: %w", ro.Kind, ro.Name, err)
			case err != nil && ctx.Err() != nil:
				// The wait is over: what the last poll saw stands.
				line = last[i]
			case err != nil:
				// Transient (an API server hiccup): keep polling and say so.
				line = "(" + err.Error() + ")"
			}
			if line != last[i] {
				fmt.Fprintf(w, "  %s (%s %s): %s\n", ro.Component, ro.Kind, ro.Name, line)
				last[i] = line
			}
			if !done && pending == nil {
				pending, pendingLine = ro, line
			}
		}
		return pending == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil && pending != nil && (errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err)):
		return fmt.Errorf("%s: %s %s not rolled out after %s (%s); its pods:\n%s",
			pending.Component, pending.Kind, pending.Name, timeout, pendingLine,
			notReadyReport(context.WithoutCancel(ctx), c, ns, pending.Pods))
	}
	return err
}

// errRolloutFailed is a rollout the API server reports as failed: waiting
// longer will not finish it.
var errRolloutFailed = errors.New("rollout failed")

// rolloutOf gets a rollout's workload and says how far it is.
func rolloutOf(ctx context.Context, c *cluster.Cluster, ns string, ro *Rollout) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch ro.Kind {
	case "Deployment":
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, ro.Name, metav1.GetOptions{})
		if err != nil {
			return "", false, fmt.Errorf("get Deployment %s: %w", ro.Name, err)
		}
		return deploymentRollout(d)
	case "DaemonSet":
		d, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, ro.Name, metav1.GetOptions{})
		if err != nil {
			return "", false, fmt.Errorf("get DaemonSet %s: %w", ro.Name, err)
		}
		line, done := daemonSetRollout(d)
		return line, done, nil
	}
	return "", false, fmt.Errorf("%s %s: %w: not a Deployment or DaemonSet", ro.Kind, ro.Name, errRolloutFailed)
}

// deploymentRollout says how far a Deployment's rollout is, as kubectl
// rollout status judges it: done once its controller has seen the latest
// spec, every replica is updated and available, and no old replica is
// left. A rollout past its progress deadline is an errRolloutFailed.
func deploymentRollout(d *appsv1.Deployment) (string, bool, error) {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	if s.ObservedGeneration < d.Generation {
		return "waiting for the Deployment controller to see the new spec", false, nil
	}
	for _, c := range s.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Reason == "ProgressDeadlineExceeded" {
			return "", false, fmt.Errorf("%w: %s", errRolloutFailed, c.Message)
		}
	}
	line := fmt.Sprintf("%d/%d updated, %d/%d available", s.UpdatedReplicas, want, s.AvailableReplicas, want)
	if old := s.Replicas - s.UpdatedReplicas; old > 0 {
		line += fmt.Sprintf(", %d old still running", old)
	}
	return line, s.UpdatedReplicas >= want && s.Replicas <= s.UpdatedReplicas && s.AvailableReplicas >= s.UpdatedReplicas, nil
}

// daemonSetRollout says how far a DaemonSet's rollout is, as kubectl
// rollout status judges it: done once its controller has seen the latest
// spec and the pod of every node it should run on is updated and
// available.
func daemonSetRollout(d *appsv1.DaemonSet) (string, bool) {
	s := d.Status
	if s.ObservedGeneration < d.Generation {
		return "waiting for the DaemonSet controller to see the new spec", false
	}
	line := fmt.Sprintf("%d/%d nodes updated, %d/%d available", s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable, s.DesiredNumberScheduled)
	return line, s.UpdatedNumberScheduled >= s.DesiredNumberScheduled && s.NumberAvailable >= s.DesiredNumberScheduled
}

// printPlan prints what Upgrade would do.
func printPlan(w io.Writer, steps []Step, revision string, opts UpgradeOptions) error {
	how := "one component at a time"
	if opts.AllAtOnce {
		how = "every component at once"
	}
	var b strings.Builder
	b.WriteString("upgrade plan for ")
	if revision != "" {
		fmt.Fprintf(&b, "revision %s in ", revision)
	}
	fmt.Fprintf(&b, "namespace %s, version %s, %s; each step waits at most %s for its rollout:\n", opts.Namespace, orNone(opts.Version), how, opts.Wait)
	for i, s := range steps {
		fmt.Fprintf(&b, "%d. %s\n", i+1, s.Title)
		if s.CRDs {
			fmt.Fprintf(&b, "   apply %d CustomResourceDefinitions\n", len(s.Objects))
			continue
		}
		for _, o := range s.Objects {
			fmt.Fprintf(&b, "   apply %s\n", kubeapply.Describe(o))
		}
		for _, ro := range s.Rollouts {
			fmt.Fprintf(&b, "   wait for %s %s/%s to roll out\n", ro.Kind, opts.Namespace, ro.Name)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// controllerDeployment is the name of a render's controller Deployment.
func controllerDeployment(r *chart.Rendered) (string, bool) {
	for _, o := range r.Objects {
		if o.GetKind() == "Deployment" && o.GetLabels()[cluster.ComponentLabel] == cluster.ControllerApp {
			return o.GetName(), true
		}
	}
	return "", false
}

// revisionOf is the revision a render's controller pods are labelled
// with: "" for the default one (or for a render without a controller).
func revisionOf(r *chart.Rendered) string {
	for _, o := range r.Objects {
		if o.GetKind() != "Deployment" || o.GetLabels()[cluster.ComponentLabel] != cluster.ControllerApp {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			return ""
		}
		if rev := d.Spec.Template.Labels[revisionLabel]; rev != "default" {
			return rev
		}
	}
	return ""
}

// revisionFlag is " --revision <r>" for a revision's render, else "".
func revisionFlag(r *chart.Rendered) string {
	if rev := revisionOf(r); rev != "" {
		return " --revision " + rev
	}
	return ""
}

// revisionName is what a revision may be called: a DNS label that still
// is one with canopy-controller- (18 characters) before it.
var revisionName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,43}[a-z0-9])?$`)

// CheckRevision checks a --revision value ("" is the default revision).
func CheckRevision(rev string) error {
	switch {
	case rev == "":
		return nil
	case rev == "default":
		return errors.New(`--revision default: the default revision is the one installed without --revision; name another, e.g. canary`)
	case !revisionName.MatchString(rev):
		return fmt.Errorf("--revision %q: want lower-case letters, digits and '-', starting and ending with a letter or digit, at most 45 characters (it suffixes canopy-controller- in object names)", rev)
	}
	return nil
}
