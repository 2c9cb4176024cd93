package taint_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/canopy-mesh/canopy/cni/taint"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

var (
	ours     = corev1.Taint{Key: taint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}
	oursExec = corev1.Taint{Key: taint.DefaultKey, Effect: corev1.TaintEffectNoExecute}
	other    = corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
)

func TestWithout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		taints  []corev1.Taint
		want    []corev1.Taint
		wantHad bool
	}{
		{name: "none"},
		{name: "only ours", taints: []corev1.Taint{ours}, wantHad: true},
		{name: "ours among others", taints: []corev1.Taint{other, ours}, want: []corev1.Taint{other}, wantHad: true},
		{name: "every effect of ours", taints: []corev1.Taint{ours, other, oursExec}, want: []corev1.Taint{other}, wantHad: true},
		{name: "only others", taints: []corev1.Taint{other}, want: []corev1.Taint{other}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := append([]corev1.Taint(nil), tt.taints...)
			got, had := taint.Without(in, taint.DefaultKey)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" || had != tt.wantHad {
				t.Errorf("Without() = %v, %v; want %v, %v (-want +got):\n%s", got, had, tt.want, tt.wantHad, diff)
			}
			if diff := cmp.Diff(tt.taints, in); diff != "" {
				t.Errorf("Without() modified its input:\n%s", diff)
			}
		})
	}
}

// TestRemove against a real API server: the taint goes, the node's other
// taints stay, and a second removal finds nothing to do.
func TestRemove(t *testing.T) {
	testenv.Need(t, env)
	name := fmt.Sprintf("taint-node-%d", time.Now().UnixNano()%100000)
	if _, err := env.Client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{other, ours}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	r := taint.Remover{Kube: env.Client, Node: name, Key: taint.DefaultKey}
	for i, want := range []bool{true, false} {
		removed, err := r.Remove(t.Context())
		if err != nil || removed != want {
			t.Fatalf("Remove #%d = %v, %v; want %v", i+1, removed, err, want)
		}
	}
	node, err := env.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server adds taints of its own (node.kubernetes.io/not-ready
	// for a node without a kubelet): only ours may have gone.
	got, _ := taint.Without(node.Spec.Taints, "node.kubernetes.io/not-ready")
	if diff := cmp.Diff([]corev1.Taint{other}, got, cmpopts.IgnoreFields(corev1.Taint{}, "TimeAdded")); diff != "" {
		t.Errorf("taints after Remove (-want +got):\n%s", diff)
	}
	if _, err := (taint.Remover{Kube: env.Client, Node: name + "-missing", Key: taint.DefaultKey}).Remove(t.Context()); !apierrors.IsNotFound(err) {
		t.Errorf("Remove on a missing node = %v, want NotFound", err)
	}
}

// TestRemoveRetriesAConflict: a node changed between the read and the
// patch is read again, and its new taints kept.
func TestRemoveRetriesAConflict(t *testing.T) {
	t.Parallel()
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{ours}}})
	conflicts := 0
	kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		// Someone adds a taint meanwhile.
		n, err := kube.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", "n1")
		if err != nil {
			return true, nil, err
		}
		node := n.(*corev1.Node).DeepCopy()
		node.Spec.Taints = append(node.Spec.Taints, other)
		if err := kube.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, node, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "n1", fmt.Errorf("the object has been modified"))
	})
	removed, err := (taint.Remover{Kube: kube, Node: "n1", Key: taint.DefaultKey}).Remove(t.Context())
	if err != nil || !removed {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	node, err := kube.CoreV1().Nodes().Get(t.Context(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]corev1.Taint{other}, node.Spec.Taints); diff != "" || conflicts != 1 {
		t.Errorf("taints after a conflict (-want +got):\n%s\nconflicts: %d", diff, conflicts)
	}
}
