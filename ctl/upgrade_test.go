package ctl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/kubeapply"
	"github.com/canopy-mesh/canopy/internal/testing/golden"
)

// obj is a rendered object of a component (its app.kubernetes.io/name,
// none when empty); workloads get pod template labels like the chart's.
func obj(kind, name, app string, podLabels ...string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": kind, "metadata": map[string]any{"name": name, "namespace": "mesh"}}}
	if app != "" {
		o.SetLabels(map[string]string{"app.kubernetes.io/name": app})
	}
	if kind == "Deployment" || kind == "DaemonSet" {
		labels := map[string]any{"app.kubernetes.io/name": app}
		for i := 0; i+1 < len(podLabels); i += 2 {
			labels[podLabels[i]] = podLabels[i+1]
		}
		_ = unstructured.SetNestedMap(o.Object, labels, "spec", "template", "metadata", "labels")
	}
	return o
}

// planSummary is a plan as text: "title: objects | rollouts (pods)".
func planSummary(steps []Step) []string {
	var out []string
	for _, s := range steps {
		var objs, rollouts []string
		for _, o := range s.Objects {
			objs = append(objs, o.GetKind()+" "+o.GetName())
		}
		for _, r := range s.Rollouts {
			rollouts = append(rollouts, r.Component+" "+r.Kind+" "+r.Name+" ("+r.Pods+")")
		}
		line := s.Title + ": " + strings.Join(objs, ", ")
		if len(rollouts) > 0 {
			line += " | " + strings.Join(rollouts, ", ")
		}
		if s.CRDs {
			line += " [CRDs]"
		}
		out = append(out, line)
	}
	return out
}

func TestPlanUpgrade(t *testing.T) {
	t.Parallel()
	crd := obj("CustomResourceDefinition", "gateways.gateway.networking.k8s.io", "")
	full := &chart.Rendered{
		CRDs: []*unstructured.Unstructured{crd},
		// In apply order, as chart.Render returns them.
		Objects: []*unstructured.Unstructured{
			obj("ServiceAccount", "canopy-cni-agent", "canopy-cni-agent"),
			obj("ServiceAccount", "canopy-controller", "canopy-controller"),
			obj("ServiceAccount", "canopy-node", "canopy-node"),
			obj("ConfigMap", "shared", ""),
			obj("Service", "canopy-controller", "canopy-controller"),
			obj("Deployment", "canopy-controller", "canopy-controller", "istio.io/rev", "default"),
			obj("DaemonSet", "canopy-cni-agent", "canopy-cni-agent"),
			obj("DaemonSet", "ztunnel", "canopy-node"),
			obj("MutatingWebhookConfiguration", "istio-sidecar-injector", "canopy-controller"),
		},
	}
	revision := &chart.Rendered{
		CRDs: []*unstructured.Unstructured{crd},
		Objects: []*unstructured.Unstructured{
			obj("ServiceAccount", "canopy-controller-canary", "canopy-controller"),
			obj("Deployment", "canopy-controller-canary", "canopy-controller", "istio.io/rev", "canary"),
		},
	}
	for _, tt := range []struct {
		name                string
		r                   *chart.Rendered
		skipCRDs, allAtOnce bool
		want                []string
	}{
		{
			name: "one component at a time, controller first",
			r:    full,
			want: []string{
				"CRDs: CustomResourceDefinition gateways.gateway.networking.k8s.io [CRDs]",
				"shared objects: ConfigMap shared",
				"controller: ServiceAccount canopy-controller, Service canopy-controller, Deployment canopy-controller, MutatingWebhookConfiguration istio-sidecar-injector" +
					" | controller Deployment canopy-controller (app.kubernetes.io/name=canopy-controller,istio.io/rev=default)",
				"CNI agent: ServiceAccount canopy-cni-agent, DaemonSet canopy-cni-agent | CNI agent DaemonSet canopy-cni-agent (app.kubernetes.io/name=canopy-cni-agent)",
				"node proxy: ServiceAccount canopy-node, DaemonSet ztunnel | node proxy DaemonSet ztunnel (app.kubernetes.io/name=canopy-node)",
			},
		},
		{
			name: "all at once", r: full, allAtOnce: true,
			want: []string{
				"CRDs: CustomResourceDefinition gateways.gateway.networking.k8s.io [CRDs]",
				"every component at once: ServiceAccount canopy-cni-agent, ServiceAccount canopy-controller, ServiceAccount canopy-node, ConfigMap shared, Service canopy-controller, " +
					"Deployment canopy-controller, DaemonSet canopy-cni-agent, DaemonSet ztunnel, MutatingWebhookConfiguration istio-sidecar-injector" +
					" | controller Deployment canopy-controller (app.kubernetes.io/name=canopy-controller,istio.io/rev=default)" +
					", CNI agent DaemonSet canopy-cni-agent (app.kubernetes.io/name=canopy-cni-agent)" +
					", node proxy DaemonSet ztunnel (app.kubernetes.io/name=canopy-node)",
			},
		},
		{
			name: "a revision, CRDs skipped", r: revision, skipCRDs: true,
			want: []string{
				"controller: ServiceAccount canopy-controller-canary, Deployment canopy-controller-canary" +
					" | controller Deployment canopy-controller-canary (app.kubernetes.io/name=canopy-controller,istio.io/rev=canary)",
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := planSummary(PlanUpgrade(tt.r, tt.skipCRDs, tt.allAtOnce))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("PlanUpgrade (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanUpgradeChart: the chart's own objects each land in their
// component's step, and nothing is left to a shared step.
func TestPlanUpgradeChart(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		revision string
		want     []string
	}{
		{"default", "", []string{"CRDs", "controller", "CNI agent", "node proxy"}},
		{"revision", "canary", []string{"CRDs", "controller"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := RenderChart(InstallOptions{Namespace: "mesh", Revision: tt.revision})
			if err != nil {
				t.Fatal(err)
			}
			steps := PlanUpgrade(r, false, false)
			var titles []string
			n := 0
			for _, s := range steps {
				titles = append(titles, s.Title)
				if !s.CRDs {
					n += len(s.Objects)
				}
			}
			if diff := cmp.Diff(tt.want, titles); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if n != len(r.Objects) {
				t.Errorf("the plan applies %d objects, the chart has %d", n, len(r.Objects))
			}
		})
	}
}

// TestUpgradeDryRun pins the printed plan; it needs no cluster.
func TestUpgradeDryRun(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		file string
		opts UpgradeOptions
	}{
		{"upgrade-plan.golden", UpgradeOptions{InstallOptions: InstallOptions{Namespace: "istio-system", Version: "1.2.3", DryRun: true, Wait: 5 * time.Minute}}},
		{"upgrade-plan-all-at-once.golden", UpgradeOptions{AllAtOnce: true, InstallOptions: InstallOptions{Namespace: "istio-system", Version: "1.2.3", DryRun: true, Wait: 5 * time.Minute}}},
		{"upgrade-plan-revision.golden", UpgradeOptions{InstallOptions: InstallOptions{Namespace: "istio-system", Version: "1.2.3", DryRun: true, Wait: time.Minute, SkipCRDs: true, Revision: "canary"}}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			if err := Upgrade(t.Context(), nil, tt.opts, &out); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tt.file, []byte(out.String()))
		})
	}
}

func TestUpgradeRefusesNoWait(t *testing.T) {
	t.Parallel()
	err := Upgrade(t.Context(), nil, UpgradeOptions{InstallOptions: InstallOptions{Namespace: "mesh", DryRun: true}}, &strings.Builder{})
	if want := "upgrade: --wait must be positive (got 0s): each step waits for its rollout before the next starts"; err == nil || err.Error() != want {
		t.Errorf("Upgrade with no wait: %v, want %q", err, want)
	}
}

func TestDeploymentRollout(t *testing.T) {
	t.Parallel()
	dep := func(gen, observed int64, want, replicas, updated, available int32, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: &want},
			Status: appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: replicas, UpdatedReplicas: updated,
				AvailableReplicas: available, Conditions: conds},
		}
	}
	type result struct {
		Line   string
		Done   bool
		Failed bool
	}
	for _, tt := range []struct {
		name string
		d    *appsv1.Deployment
		want result
	}{
		{"rolled out", dep(2, 2, 2, 2, 2, 2), result{"2/2 updated, 2/2 available", true, false}},
		{"new spec not seen yet", dep(3, 2, 2, 2, 2, 2), result{"waiting for the Deployment controller to see the new spec", false, false}},
		{"surge: new pod not available, old one left", dep(2, 2, 1, 2, 1, 1), result{"1/1 updated, 1/1 available, 1 old still running", false, false}},
		{"half updated", dep(2, 2, 2, 3, 1, 2), result{"1/2 updated, 2/2 available, 2 old still running", false, false}},
		{"updated, not available", dep(2, 2, 2, 2, 2, 1), result{"2/2 updated, 1/2 available", false, false}},
		{"progress deadline exceeded", dep(2, 2, 2, 3, 1, 2, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "c-1" has timed out progressing.`}),
			result{"", false, true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line, done, err := deploymentRollout(tt.d)
			if err != nil && !errors.Is(err, errRolloutFailed) {
				t.Fatalf("error %v is not an errRolloutFailed", err)
			}
			if diff := cmp.Diff(tt.want, result{line, done, err != nil}); diff != "" {
				t.Errorf("deploymentRollout (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDaemonSetRollout(t *testing.T) {
	t.Parallel()
	ds := func(gen, observed int64, desired, updated, available int32) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Status: appsv1.DaemonSetStatus{
			ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: available}}
	}
	type result struct {
		Line string
		Done bool
	}
	for _, tt := range []struct {
		name string
		d    *appsv1.DaemonSet
		want result
	}{
		{"rolled out", ds(2, 2, 2, 2, 2), result{"2/2 nodes updated, 2/2 available", true}},
		{"new spec not seen yet", ds(3, 2, 2, 2, 2), result{"waiting for the DaemonSet controller to see the new spec", false}},
		{"one node left", ds(2, 2, 2, 1, 2), result{"1/2 nodes updated, 2/2 available", false}},
		{"updated, one not available", ds(2, 2, 2, 2, 1), result{"2/2 nodes updated, 1/2 available", false}},
		{"no node to run on", ds(1, 1, 0, 0, 0), result{"0/0 nodes updated, 0/0 available", true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line, done := daemonSetRollout(tt.d)
			if diff := cmp.Diff(tt.want, result{line, done}); diff != "" {
				t.Errorf("daemonSetRollout (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckRevision(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		rev, wantErr string
	}{
		{"", ""},
		{"canary", ""},
		{"1-33", ""},
		{strings.Repeat("a", 45), ""},
		{"default", "--revision default: the default revision is the one installed without --revision; name another, e.g. canary"},
		{"Canary", `--revision "Canary": want lower-case letters, digits and '-', starting and ending with a letter or digit, at most 45 characters (it suffixes canopy-controller- in object names)`},
		{"1.33", `--revision "1.33": want lower-case letters, digits and '-', starting and ending with a letter or digit, at most 45 characters (it suffixes canopy-controller- in object names)`},
		{"-x", `--revision "-x": want lower-case letters, digits and '-', starting and ending with a letter or digit, at most 45 characters (it suffixes canopy-controller- in object names)`},
		{strings.Repeat("a", 46), `--revision "` + strings.Repeat("a", 46) + `": want lower-case letters, digits and '-', starting and ending with a letter or digit, at most 45 characters (it suffixes canopy-controller- in object names)`},
	} {
		err := CheckRevision(tt.rev)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.wantErr {
			t.Errorf("CheckRevision(%q) = %q, want %q", tt.rev, got, tt.wantErr)
		}
	}
}

// TestRevisionRender: --revision renders only the revision's control
// plane, and a values file cannot undo it.
func TestRevisionRender(t *testing.T) {
	t.Parallel()
	r, err := RenderChart(InstallOptions{Namespace: "mesh", Revision: "canary", Set: []string{"revision="}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range r.Objects {
		if o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet" {
			got = append(got, kubeapply.Describe(o))
		}
	}
	if diff := cmp.Diff([]string{"Deployment mesh/canopy-controller-canary"}, got); diff != "" {
		t.Errorf("workloads (-want +got):\n%s", diff)
	}
	if rev := revisionOf(r); rev != "canary" {
		t.Errorf("revisionOf = %q, want canary", rev)
	}
}
