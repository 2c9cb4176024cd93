package kubelet

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerView is what status computation needs of one container.
type containerView struct {
	Name         string
	Image        string
	RestartCount int32
	Started      bool
	Ready        bool
	State        corev1.ContainerState
	LastState    corev1.ContainerState
}

// podView is what status computation needs of one pod.
type podView struct {
	RestartPolicy  corev1.RestartPolicy
	HostIP         string
	PodIPs         []string
	StartTime      metav1.Time
	InitContainers []containerView
	Containers     []containerView
	// Message explains a pod that cannot start (bad image, CNI failure).
	Reason, Message string
	Failed          bool
}

// buildStatus computes a pod's status from its runtime view. It is a pure
// function: the same view gives the same status. A condition keeps its
// transition time from prev while its status stays the same.
func buildStatus(v podView, prev []corev1.PodCondition, now metav1.Time) corev1.PodStatus {
	s := corev1.PodStatus{
		HostIP:    v.HostIP,
		StartTime: &v.StartTime,
		Reason:    v.Reason,
		Message:   v.Message,
	}
	if v.HostIP != "" {
		s.HostIPs = []corev1.HostIP{{IP: v.HostIP}}
	}
	if len(v.PodIPs) > 0 {
		s.PodIP = v.PodIPs[0]
		for _, ip := range v.PodIPs {
			s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	for _, c := range v.InitContainers {
		s.InitContainerStatuses = append(s.InitContainerStatuses, c.status())
	}
	for _, c := range v.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, c.status())
	}

	initialized := allInitDone(v.InitContainers)
	ready := initialized && len(v.Containers) > 0
	for _, c := range v.Containers {
		ready = ready && c.Ready
	}
	s.Phase = phase(v, initialized)
	s.Conditions = []corev1.PodCondition{
		condition(corev1.PodScheduled, true, prev, now),
		condition(corev1.PodInitialized, initialized, prev, now),
		condition(corev1.ContainersReady, ready, prev, now),
		condition(corev1.PodReady, ready, prev, now),
	}
	return s
}

func (c containerView) status() corev1.ContainerStatus {
	started := c.Started
	return corev1.ContainerStatus{
		Name:                 c.Name,
		Image:                c.Image,
		ImageID:              c.Image,
		Ready:                c.Ready,
		Started:              &started,
		RestartCount:         c.RestartCount,
		State:                c.State,
		LastTerminationState: c.LastState,
	}
}

func allInitDone(init []containerView) bool {
	for _, c := range init {
		if t := c.State.Terminated; t == nil || t.ExitCode != 0 {
			return false
		}
	}
	return true
}

func phase(v podView, initialized bool) corev1.PodPhase {
	if v.Failed {
		return corev1.PodFailed
	}
	if !initialized || len(v.Containers) == 0 {
		return corev1.PodPending
	}
	running, succeeded, failed := 0, 0, 0
	for _, c := range v.Containers {
		switch {
		case c.State.Running != nil:
			running++
		case c.State.Terminated != nil && c.State.Terminated.ExitCode == 0:
			succeeded++
		case c.State.Terminated != nil:
			failed++
		}
	}
	n := len(v.Containers)
	switch {
	case succeeded+failed == n && v.RestartPolicy == corev1.RestartPolicyNever:
		if failed > 0 {
			return corev1.PodFailed
		}
		return corev1.PodSucceeded
	case succeeded == n && v.RestartPolicy == corev1.RestartPolicyOnFailure:
		return corev1.PodSucceeded
	case running > 0 || succeeded+failed > 0:
		// Containers that exited and will restart keep the pod Running,
		// as on a kubelet.
		return corev1.PodRunning
	default:
		return corev1.PodPending
	}
}

func condition(t corev1.PodConditionType, ok bool, prev []corev1.PodCondition, now metav1.Time) corev1.PodCondition {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	for _, c := range prev {
		if c.Type == t && c.Status == status {
			return c
		}
	}
	return corev1.PodCondition{Type: t, Status: status, LastTransitionTime: now}
}
