package identity

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// APIPods reads pods straight from the API server: one GET and one LIST
// filtered by node per impersonated request. It suits tests and tools; the
// controller answers from its informers' view instead
// (cmd/canopy-controller/pods.go), so that certificates cost the API
// server nothing.
type APIPods struct{ Client kubernetes.Interface }

// Pod implements Pods.
func (a APIPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return a.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// PodsOnNode implements Pods.
func (a APIPods) PodsOnNode(ctx context.Context, namespace, node string) ([]*corev1.Pod, error) {
	list, err := a.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}
