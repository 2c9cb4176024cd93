package scheduler

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name string, ready bool, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}},
	}
}

func TestPickNode(t *testing.T) {
	t.Parallel()
	zoneA := map[string]string{"zone": "a"}
	noSchedule := corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	nodes := []*corev1.Node{
		node("n1", true, zoneA),
		node("n2", true, nil),
		node("n3", false, zoneA, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}),
		node("n4", true, zoneA, noSchedule),
	}
	daemonPod := &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}},
		}}},
	}}}}
	for _, tt := range []struct {
		name    string
		pod     *corev1.Pod
		load    map[string]int
		want    string
		wantErr bool
	}{
		{name: "least loaded", pod: &corev1.Pod{}, load: map[string]int{"n1": 3, "n2": 1}, want: "n2"},
		{name: "tie by name", pod: &corev1.Pod{}, want: "n1"},
		{name: "node selector", pod: &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: zoneA}}, load: map[string]int{"n1": 9}, want: "n1"},
		{name: "daemonset affinity by name", pod: daemonPod, want: "n2"},
		{name: "toleration admits tainted node", pod: &corev1.Pod{Spec: corev1.PodSpec{
			NodeSelector: zoneA,
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		}}, load: map[string]int{"n1": 5}, want: "n4"},
		{name: "daemon tolerates not-ready", pod: &corev1.Pod{Spec: corev1.PodSpec{
			NodeSelector: zoneA,
			Tolerations:  []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists}},
		}}, load: map[string]int{"n1": 5}, want: "n3"},
		{name: "nothing fits", pod: &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: map[string]string{"zone": "z"}}}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := PickNode(tt.pod, nodes, tt.load)
			if tt.wantErr {
				if !errors.Is(err, ErrNoFit) {
					t.Fatalf("PickNode() = %q, %v; want ErrNoFit", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("PickNode() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
