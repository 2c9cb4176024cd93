package kubelet

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
}

func exited(code int32) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
}

func TestBuildStatusPhaseAndReady(t *testing.T) {
	t.Parallel()
	now := metav1.NewTime(time.Unix(1000, 0))
	for _, tt := range []struct {
		name      string
		view      podView
		wantPhase corev1.PodPhase
		wantReady bool
	}{
		{"no containers started", podView{Containers: []containerView{{}}}, corev1.PodPending, false},
		{"running, not ready", podView{Containers: []containerView{{State: running()}}}, corev1.PodRunning, false},
		{"running and ready", podView{Containers: []containerView{{State: running(), Ready: true}}}, corev1.PodRunning, true},
		{"one of two ready", podView{Containers: []containerView{{State: running(), Ready: true}, {State: running()}}}, corev1.PodRunning, false},
		{"init pending", podView{InitContainers: []containerView{{State: running()}}, Containers: []containerView{{}}}, corev1.PodPending, false},
		{"init done", podView{InitContainers: []containerView{{State: exited(0)}}, Containers: []containerView{{State: running(), Ready: true}}}, corev1.PodRunning, true},
		{"init failed", podView{InitContainers: []containerView{{State: exited(1)}}, Containers: []containerView{{}}}, corev1.PodPending, false},
		{"never: all succeeded", podView{RestartPolicy: corev1.RestartPolicyNever, Containers: []containerView{{State: exited(0)}}}, corev1.PodSucceeded, false},
		{"never: one failed", podView{RestartPolicy: corev1.RestartPolicyNever, Containers: []containerView{{State: exited(0)}, {State: exited(2)}}}, corev1.PodFailed, false},
		{"onfailure: succeeded", podView{RestartPolicy: corev1.RestartPolicyOnFailure, Containers: []containerView{{State: exited(0)}}}, corev1.PodSucceeded, false},
		{"always: exited, restarting", podView{RestartPolicy: corev1.RestartPolicyAlways, Containers: []containerView{{State: exited(1)}}}, corev1.PodRunning, false},
		{"failed sandbox", podView{Failed: true, Containers: []containerView{{}}}, corev1.PodFailed, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := buildStatus(tt.view, nil, now)
			if got.Phase != tt.wantPhase {
				t.Errorf("phase = %s, want %s", got.Phase, tt.wantPhase)
			}
			var ready bool
			for _, c := range got.Conditions {
				if c.Type == corev1.PodReady {
					ready = c.Status == corev1.ConditionTrue
				}
			}
			if ready != tt.wantReady {
				t.Errorf("ready = %v, want %v", ready, tt.wantReady)
			}
		})
	}
}

func TestBuildStatusIPsAndTransitionTimes(t *testing.T) {
	t.Parallel()
	t0 := metav1.NewTime(time.Unix(1000, 0))
	t1 := metav1.NewTime(time.Unix(2000, 0))
	v := podView{HostIP: "10.99.0.11", PodIPs: []string{"10.244.1.5", "fd00::5"}, Containers: []containerView{{State: running()}}}
	first := buildStatus(v, nil, t0)
	if first.PodIP != "10.244.1.5" || len(first.PodIPs) != 2 || first.HostIPs[0].IP != "10.99.0.11" {
		t.Errorf("IPs = %s %v %v", first.PodIP, first.PodIPs, first.HostIPs)
	}

	// Unchanged conditions keep their time; a changed one gets the new time.
	v.Containers[0].Ready = true
	second := buildStatus(v, first.Conditions, t1)
	times := map[corev1.PodConditionType]metav1.Time{}
	for _, c := range second.Conditions {
		times[c.Type] = c.LastTransitionTime
	}
	want := map[corev1.PodConditionType]metav1.Time{
		corev1.PodScheduled:    t0,
		corev1.PodInitialized:  t0,
		corev1.ContainersReady: t1,
		corev1.PodReady:        t1,
	}
	if diff := cmp.Diff(want, times); diff != "" {
		t.Errorf("transition times (-want +got):\n%s", diff)
	}
}
