// Package taint removes the CNI agent's startup taint from its node.
//
// A node that registers with the taint (kubelet
// --register-with-taints=cni.canopy.dev/not-ready=:NoSchedule) takes no
// pod that does not tolerate it until the agent says the node can enroll
// pods: its plugin is in the CNI chain and a self-test enrollment passed.
// Until then a pod of an ambient namespace could start before canopy-cni
// is in the chain, and so outside the mesh. The agent only removes the
// taint; it never puts it back (an agent upgrade must not empty a node).
//
// Remover is safe for concurrent use.
package taint

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// DefaultKey is the startup taint's key.
const DefaultKey = "cni.canopy.dev/not-ready"

// Without returns taints without those with key (whatever their effect),
// and whether there were any. taints is not modified.
func Without(taints []corev1.Taint, key string) ([]corev1.Taint, bool) {
	out := make([]corev1.Taint, 0, len(taints))
	for _, t := range taints {
		if t.Key != key {
			out = append(out, t)
		}
	}
	return out, len(out) != len(taints)
}

// Remover takes the taint Key off Node.
type Remover struct {
	Kube kubernetes.Interface
	Node string
	Key  string
}

// Remove takes the taint off the node, if it has it, and reports whether
// it did. The patch carries the node's resourceVersion, so a concurrent
// change of the node's taints is never overwritten: it is read again.
func (r Remover) Remove(ctx context.Context) (bool, error) {
	removed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := r.Kube.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rest, had := Without(node.Spec.Taints, r.Key)
		if !had {
			return nil
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
			"spec":     map[string]any{"taints": rest},
		})
		if err != nil {
			return err
		}
		if _, err := r.Kube.CoreV1().Nodes().Patch(ctx, r.Node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return err
		}
		removed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("remove taint %s from node %s: %w", r.Key, r.Node, err)
	}
	return removed, nil
}
