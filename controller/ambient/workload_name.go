package ambient

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations that name a workload (wire contract §7.4).
const (
	// LabelWorkloadName overrides the workload name of a pod or
	// WorkloadEntry.
	LabelWorkloadName = "service.istio.io/workload-name"
	// AnnotationAutoRegistrationGroup names the WorkloadGroup that
	// registered a WorkloadEntry.
	AnnotationAutoRegistrationGroup = "istio.io/autoRegistrationGroup"
)

// podWorkloadName is Workload.workload_name of a pod, as istiod derives it
// (GetWorkloadMetaFromPod and GetDeployMetaFromPod in Istio's
// pkg/kube/util.go): the label service.istio.io/workload-name when present;
// else, for a pod whose name was generated, its controller's name, where
//   - a ReplicaSet's name loses the pod's "-<pod-template-hash>" (the
//     Deployment), or its "-<rollouts-pod-template-hash>" (the Argo Rollout);
//   - a ReplicationController of an OpenShift DeploymentConfig gives the
//     pod's deploymentconfig label;
//   - a Job named "<name>-<8 to 10 digits>" gives <name> (the CronJob);
//
// else the pod's name. A pod with a fixed name (a StatefulSet's, or one
// created by hand) is its own workload.
func podWorkloadName(pod *corev1.Pod) string {
	if name, ok := pod.Labels[LabelWorkloadName]; ok {
		return name
	}
	if pod.GenerateName == "" {
		return pod.Name
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return pod.Name
	}
	name := ref.Name
	switch hash, rollout := pod.Labels["pod-template-hash"], pod.Labels["rollouts-pod-template-hash"]; {
	case ref.Kind == "ReplicaSet" && hash != "" && strings.HasSuffix(ref.Name, hash):
		name = strings.TrimSuffix(ref.Name, "-"+hash)
	case ref.Kind == "ReplicaSet" && rollout != "" && strings.HasSuffix(ref.Name, rollout):
		name = strings.TrimSuffix(ref.Name, "-"+rollout)
	case ref.Kind == "ReplicationController" && pod.Labels["deploymentconfig"] != "":
		name = pod.Labels["deploymentconfig"]
	case ref.Kind == "Job":
		if cronJob, ok := cronJobName(ref.Name); ok {
			name = cronJob
		}
	}
	if name == "" {
		return pod.Name
	}
	return name
}

// cronJobName is the CronJob of a Job the CronJob controller named
// "<cronjob>-<scheduled time>", the time being 8 to 10 digits.
func cronJobName(job string) (string, bool) {
	i := strings.LastIndexByte(job, '-')
	if i < 1 {
		return "", false
	}
	suffix := job[i+1:]
	if len(suffix) < 8 || len(suffix) > 10 {
		return "", false
	}
	for _, c := range suffix {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return job[:i], true
}

// entryWorkloadName is Workload.workload_name of a WorkloadEntry, as
// istiod's WorkloadNameFromWorkloadEntry (Istio's pkg/kube/labels): the
// WorkloadGroup that auto-registered it, else the label
// service.istio.io/workload-name of its labels, else its name.
func entryWorkloadName(meta metav1.ObjectMeta, labels map[string]string) string {
	if group, ok := meta.Annotations[AnnotationAutoRegistrationGroup]; ok {
		return group
	}
	if name, ok := labels[LabelWorkloadName]; ok {
		return name
	}
	return meta.Name
}

// CanonicalNames picks the telemetry name and revision as istiod's
// CanonicalService (Istio's pkg/kube/labels) does: the first of the labels
// that is present, even with an empty value, else the workload name and
// "latest".
func CanonicalNames(labels map[string]string, workloadName string) (name, revision string) {
	name, ok := firstLabel(labels, LabelCanonicalName, LabelAppName, LabelApp)
	if !ok {
		name = workloadName
	}
	revision, ok = firstLabel(labels, LabelCanonicalRevision, LabelAppVersion, LabelVersion)
	if !ok {
		revision = "latest"
	}
	return name, revision
}

func firstLabel(labels map[string]string, keys ...string) (string, bool) {
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			return v, true
		}
	}
	return "", false
}
