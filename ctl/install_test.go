package ctl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMergeValues(t *testing.T) {
	a := map[string]any{"image": map[string]any{"hub": "canopy", "tag": "1"}, "node": map[string]any{"logLevel": "info"}}
	b := map[string]any{"image": map[string]any{"tag": "2"}, "cniAgent": map[string]any{"probeUID": 0}, "node": "replaced"}
	want := map[string]any{"image": map[string]any{"hub": "canopy", "tag": "2"}, "cniAgent": map[string]any{"probeUID": 0}, "node": "replaced"}
	if diff := cmp.Diff(want, mergeValues(a, b)); diff != "" {
		t.Errorf("mergeValues (-want +got):\n%s", diff)
	}
	if a["image"].(map[string]any)["tag"] != "1" {
		t.Error("mergeValues changed its input")
	}
}

func TestReadiness(t *testing.T) {
	ds := func(gen, observed int64, desired, updated, ready int32) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Status: appsv1.DaemonSetStatus{
			ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberReady: ready}}
	}
	for _, tt := range []struct {
		name string
		d    *appsv1.DaemonSet
		want bool
	}{
		{"all updated and ready", ds(2, 2, 2, 2, 2), true},
		{"spec change not yet observed", ds(3, 2, 2, 2, 2), false},
		{"rolling: one old pod left", ds(2, 2, 2, 1, 2), false},
		{"a pod not ready", ds(2, 2, 2, 2, 1), false},
		{"no node scheduled yet", ds(1, 1, 0, 0, 0), false},
	} {
		if got := daemonSetReady(tt.d); got != tt.want {
			t.Errorf("%s: daemonSetReady = %v, want %v", tt.name, got, tt.want)
		}
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 1}}
	if deploymentReady(d, 2) {
		t.Error("a Deployment with one of two replicas ready counted as ready")
	}
	d.Status.ReadyReplicas = 2
	if !deploymentReady(d, 2) {
		t.Error("a Deployment with every replica updated and ready not counted as ready")
	}
}

func TestParseOutput(t *testing.T) {
	for _, tt := range []struct {
		s        string
		accepted []Output
		wantErr  string
	}{
		{"", ListFormats(), ""},
		{"json", ListFormats(), ""},
		{"wide", WorkloadsFormats(), ""},
		{"wide", ListFormats(), `unknown output format "wide": use json or yaml, or no -o for the table`},
		{"table", WorkloadsFormats(), `unknown output format "table": use wide, json or yaml, or no -o for the table`},
	} {
		_, err := ParseOutput(tt.s, tt.accepted)
		if got := fmt.Sprint(err); (tt.wantErr == "" && err != nil) || (tt.wantErr != "" && got != tt.wantErr) {
			t.Errorf("ParseOutput(%q, %v) = %v, want %q", tt.s, tt.accepted, err, tt.wantErr)
		}
	}
}

// TestInstallDryRun: --dry-run prints the manifests without a cluster,
// CRDs first unless skipped, and bad values fail before anything prints.
func TestInstallDryRun(t *testing.T) {
	var out strings.Builder
	if err := Install(t.Context(), nil, InstallOptions{Namespace: "mesh", Version: "1.0.0", DryRun: true, Set: []string{"node.logLevel=debug"}}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"kind: CustomResourceDefinition", "kind: DaemonSet", "namespace: mesh", "image: canopy/canopy-node:1.0.0", "--log-level=debug"} {
		if !strings.Contains(got, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
	if strings.Index(got, "kind: CustomResourceDefinition") > strings.Index(got, "kind: ServiceAccount") {
		t.Error("CRDs are not printed first")
	}
	out.Reset()
	if err := Install(t.Context(), nil, InstallOptions{Namespace: "mesh", DryRun: true, SkipCRDs: true}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "CustomResourceDefinition") {
		t.Error("--skip-crds printed CRDs")
	}
	out.Reset()
	err := Install(t.Context(), nil, InstallOptions{Namespace: "mesh", DryRun: true, Set: []string{"cniAgent.backend=bpf"}}, &out)
	if err == nil || out.Len() != 0 {
		t.Errorf("bad values: err %v, %d bytes printed", err, out.Len())
	}
}
