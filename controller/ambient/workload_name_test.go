package ambient

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPodWorkloadName follows istiod's workloadName
// (pilot/pkg/serviceregistry/ambient/workloads.go), which is
// GetWorkloadMetaFromPod in pkg/kube/util.go: the label
// service.istio.io/workload-name when present, else GetDeployMetaFromPod,
// which reads the controlling owner only for a pod with generateName.
func TestPodWorkloadName(t *testing.T) {
	t.Parallel()
	owner := func(kind, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: kind, Name: name, Controller: ptr.To(true)}}
	}
	for _, tt := range []struct {
		name string
		meta metav1.ObjectMeta
		want string
	}{
		{"deployment", metav1.ObjectMeta{Name: "echo-7d9c4-x2x9q", GenerateName: "echo-7d9c4-",
			Labels: map[string]string{"pod-template-hash": "7d9c4"}, OwnerReferences: owner("ReplicaSet", "echo-7d9c4")}, "echo"},
		{"replica set without the hash label", metav1.ObjectMeta{Name: "echo-7d9c4-x2x9q", GenerateName: "echo-7d9c4-",
			OwnerReferences: owner("ReplicaSet", "echo-7d9c4")}, "echo-7d9c4"},
		{"replica set whose name does not end in the hash", metav1.ObjectMeta{Name: "rs-x2x9q", GenerateName: "rs-",
			Labels: map[string]string{"pod-template-hash": "7d9c4"}, OwnerReferences: owner("ReplicaSet", "rs")}, "rs"},
		{"owner ignored without generateName", metav1.ObjectMeta{Name: "echo-manual",
			Labels: map[string]string{"pod-template-hash": "7d9c4"}, OwnerReferences: owner("ReplicaSet", "echo-7d9c4")}, "echo-manual"},
		{"stateful set pods have no generateName", metav1.ObjectMeta{Name: "db-0", OwnerReferences: owner("StatefulSet", "db")}, "db-0"},
		{"daemon set", metav1.ObjectMeta{Name: "agent-k2j4x", GenerateName: "agent-", OwnerReferences: owner("DaemonSet", "agent")}, "agent"},
		{"job", metav1.ObjectMeta{Name: "migrate-8xk2p", GenerateName: "migrate-", OwnerReferences: owner("Job", "migrate")}, "migrate"},
		{"job of a cron job", metav1.ObjectMeta{Name: "backup-28934567-8xk2p", GenerateName: "backup-28934567-",
			OwnerReferences: owner("Job", "backup-28934567")}, "backup"},
		{"job with a ten digit suffix", metav1.ObjectMeta{Name: "x", GenerateName: "report-1700000000-",
			OwnerReferences: owner("Job", "report-1700000000")}, "report"},
		{"job with a seven digit suffix is no cron job's", metav1.ObjectMeta{Name: "x", GenerateName: "job-1234567-",
			OwnerReferences: owner("Job", "job-1234567")}, "job-1234567"},
		{"argo rollout", metav1.ObjectMeta{Name: "web-6d4f8-abcde", GenerateName: "web-6d4f8-",
			Labels: map[string]string{"rollouts-pod-template-hash": "6d4f8"}, OwnerReferences: owner("ReplicaSet", "web-6d4f8")}, "web"},
		{"openshift deployment config", metav1.ObjectMeta{Name: "app-3-xk2p9", GenerateName: "app-3-",
			Labels: map[string]string{"deploymentconfig": "app"}, OwnerReferences: owner("ReplicationController", "app-3")}, "app"},
		{"replication controller", metav1.ObjectMeta{Name: "rc-xk2p9", GenerateName: "rc-", OwnerReferences: owner("ReplicationController", "rc")}, "rc"},
		{"owner that is not the controller", metav1.ObjectMeta{Name: "p-xk2p9", GenerateName: "p-",
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs"}}}, "p-xk2p9"},
		{"generated bare pod", metav1.ObjectMeta{Name: "p-xk2p9", GenerateName: "p-"}, "p-xk2p9"},
		{"workload-name label wins", metav1.ObjectMeta{Name: "echo-7d9c4-x2x9q", GenerateName: "echo-7d9c4-",
			Labels:          map[string]string{LabelWorkloadName: "checkout", "pod-template-hash": "7d9c4"},
			OwnerReferences: owner("ReplicaSet", "echo-7d9c4")}, "checkout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := testPod(func(p *corev1.Pod) { p.ObjectMeta = tt.meta })
			if got := podWorkloadName(p); got != tt.want {
				t.Errorf("podWorkloadName() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestCanonicalNames follows istiod's CanonicalService (pkg/kube/labels):
// the first of the labels that is present wins, even with an empty value.
func TestCanonicalNames(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name                   string
		labels                 map[string]string
		wantName, wantRevision string
	}{
		{"canonical labels", map[string]string{LabelCanonicalName: "c", LabelAppName: "n", LabelApp: "a",
			LabelCanonicalRevision: "r", LabelAppVersion: "1", LabelVersion: "v"}, "c", "r"},
		{"app.kubernetes.io labels", map[string]string{LabelAppName: "n", LabelApp: "a", LabelAppVersion: "1", LabelVersion: "v"}, "n", "1"},
		{"app and version", map[string]string{LabelApp: "a", LabelVersion: "v"}, "a", "v"},
		{"none", nil, "workload", "latest"},
		{"present but empty", map[string]string{LabelApp: "", LabelVersion: ""}, "", ""},
		{"empty canonical label wins over app", map[string]string{LabelCanonicalName: "", LabelApp: "a"}, "", "latest"},
	} {
		name, revision := CanonicalNames(tt.labels, "workload")
		if name != tt.wantName || revision != tt.wantRevision {
			t.Errorf("%s: CanonicalNames() = %q, %q; want %q, %q", tt.name, name, revision, tt.wantName, tt.wantRevision)
		}
	}
}

// TestWorkloadEntryWorkloadName follows istiod's
// WorkloadNameFromWorkloadEntry (pkg/kube/labels): the annotation
// istio.io/autoRegistrationGroup, else the label
// service.istio.io/workload-name (of the merged labels), else the entry's
// name; an owner reference is not read.
func TestWorkloadEntryWorkloadName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		labels      map[string]string
		owners      []metav1.OwnerReference
		want        string
	}{
		{name: "name", want: "vm-1"},
		{name: "auto-registration group", annotations: map[string]string{AnnotationAutoRegistrationGroup: "payments-vms"},
			labels: map[string]string{LabelWorkloadName: "ignored"}, want: "payments-vms"},
		{name: "workload-name label", labels: map[string]string{LabelWorkloadName: "payments"}, want: "payments"},
		{name: "workload group owner is not read", owners: []metav1.OwnerReference{{Kind: "WorkloadGroup", Name: "payments-vms"}}, want: "vm-1"},
	} {
		got := entryWorkloadName(metav1.ObjectMeta{Name: "vm-1", Annotations: tt.annotations, OwnerReferences: tt.owners}, tt.labels)
		if got != tt.want {
			t.Errorf("%s: entryWorkloadName() = %q, want %q", tt.name, got, tt.want)
		}
	}
}
