package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/enroll"
)

// ConditionEnrolled is the pod condition carrying the verified state:
// True once the agent saw the rules in place (lastProbeTime says when),
// False with the reason when it could not enroll the pod.
const ConditionEnrolled corev1.PodConditionType = "mesh.canopy.dev/Enrolled"

// Condition reasons.
const (
	ReasonVerified = "Verified"
	ReasonRepaired = "Repaired"
	ReasonPending  = "NodeProxyPending"
	ReasonFailed   = "EnrollmentFailed"
	ReasonNoNetns  = "NetnsNotFound"
	// ReasonInvalidSettings: the pod's settings (a sidecar pod's traffic
	// annotations) are malformed or unsupported. An enrolled pod keeps
	// the rules it has (condition True); another is not enrolled (False).
	ReasonInvalidSettings = "InvalidSettings"
)

// publish writes the redirection annotation (empty value: leave it) and
// the Enrolled condition through the status subresource.
func (a *Agent) publish(ctx context.Context, pod *corev1.Pod, annotation string, ok bool, reason, message string, probed time.Time) error {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	transition := metav1.NewTime(probed)
	for _, c := range pod.Status.Conditions {
		if c.Type == ConditionEnrolled && c.Status == status {
			transition = c.LastTransitionTime
		}
	}
	if !ok && unchanged(pod, annotation, status, reason, message) {
		// A failure is written once, not on every pass: each write is a
		// pod update that wakes every watcher, this agent included.
		return nil
	}
	patch := map[string]any{
		"status": map[string]any{"conditions": []corev1.PodCondition{{
			Type: ConditionEnrolled, Status: status, Reason: reason, Message: message,
			LastProbeTime: metav1.NewTime(probed), LastTransitionTime: transition,
		}}},
	}
	if annotation != "" {
		patch["metadata"] = map[string]any{"annotations": map[string]string{enroll.AnnotationRedirection: annotation}}
	}
	return a.patchStatus(ctx, pod, patch)
}

// unpublish removes the annotation and the condition.
func (a *Agent) unpublish(ctx context.Context, pod *corev1.Pod) error {
	patch := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{enroll.AnnotationRedirection: nil}},
		"status":   map[string]any{"conditions": []map[string]any{{"type": ConditionEnrolled, "$patch": "delete"}}},
	}
	return a.patchStatus(ctx, pod, patch)
}

func (a *Agent) patchStatus(ctx context.Context, pod *corev1.Pod, patch map[string]any) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := a.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// unchanged reports whether the pod already shows this state.
func unchanged(pod *corev1.Pod, annotation string, status corev1.ConditionStatus, reason, message string) bool {
	if annotation != "" && pod.Annotations[enroll.AnnotationRedirection] != annotation {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == ConditionEnrolled {
			return c.Status == status && c.Reason == reason && c.Message == message
		}
	}
	return false
}
