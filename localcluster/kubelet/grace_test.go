package kubelet

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestGracePeriod: containers get the grace a kubelet gives them, long
// ones included: a node proxy drains for 20 s of its 30.
func TestGracePeriod(t *testing.T) {
	for _, tt := range []struct {
		name           string
		deletion, spec *int64
		want           time.Duration
	}{
		{"default", nil, nil, 30 * time.Second},
		{"the pod's", nil, ptr.To[int64](45), 45 * time.Second},
		{"the deletion's first", ptr.To[int64](0), ptr.To[int64](45), 0},
		{"a long one whole", ptr.To[int64](120), nil, 2 * time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{TerminationGracePeriodSeconds: tt.spec}}
			pod.DeletionGracePeriodSeconds = tt.deletion
			if got := gracePeriod(pod); got != tt.want {
				t.Errorf("gracePeriod = %s, want %s", got, tt.want)
			}
		})
	}
}
