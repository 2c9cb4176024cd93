package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestEnvValue: the references a kubelet resolves when a container starts,
// the pod's IP among them (virtual-kubelet cannot: it resolves before the
// pod has one).
func TestEnvValue(t *testing.T) {
	client := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns"}, Data: map[string]string{"k": "from-cm"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"k": []byte("from-secret")}},
	)
	v := volumeSource{client: client}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Labels: map[string]string{"app": "echo"}, Annotations: map[string]string{"a/b": "c"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "sa"},
	}
	hostNet := pod.DeepCopy()
	hostNet.Spec.HostNetwork = true
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	for _, tt := range []struct {
		name    string
		pod     *corev1.Pod
		from    *corev1.EnvVarSource
		value   string
		want    string
		wantErr bool
	}{
		{name: "plain value", pod: pod, value: "x", want: "x"},
		{name: "pod name", pod: pod, from: field("metadata.name"), want: "p"},
		{name: "namespace", pod: pod, from: field("metadata.namespace"), want: "ns"},
		{name: "node", pod: pod, from: field("spec.nodeName"), want: "node-1"},
		{name: "service account", pod: pod, from: field("spec.serviceAccountName"), want: "sa"},
		{name: "pod IP", pod: pod, from: field("status.podIP"), want: "10.0.0.5"},
		{name: "pod IPs", pod: pod, from: field("status.podIPs"), want: "10.0.0.5,fd00::5"},
		{name: "host-network pod IP is the node's", pod: hostNet, from: field("status.podIP"), want: "10.99.0.11"},
		{name: "host IP", pod: pod, from: field("status.hostIP"), want: "10.99.0.11"},
		{name: "one label", pod: pod, from: field("metadata.labels['app']"), want: "echo"},
		{name: "one annotation", pod: pod, from: field("metadata.annotations['a/b']"), want: "c"},
		{name: "unknown field", pod: pod, from: field("spec.nope"), wantErr: true},
		{name: "ConfigMap key", pod: pod, from: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}, want: "from-cm"},
		{name: "missing ConfigMap key", pod: pod, from: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "nope"}}, wantErr: true},
		{name: "optional missing ConfigMap", pod: pod, from: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "none"}, Key: "k", Optional: ptr.To(true)}}, want: ""},
		{name: "Secret key", pod: pod, from: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "k"}}, want: "from-secret"},
		{name: "missing Secret", pod: pod, from: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "none"}, Key: "k"}}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := v.envValue(t.Context(), tt.pod, []string{"10.0.0.5", "fd00::5"}, "10.99.0.11", corev1.EnvVar{Name: "X", Value: tt.value, ValueFrom: tt.from})
			if (err != nil) != tt.wantErr {
				t.Fatalf("envValue = %q, %v; want error %v", got, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("envValue = %q, want %q", got, tt.want)
			}
		})
	}
}
