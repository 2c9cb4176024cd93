package inject

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ignoredNamespaces are never injected, as in Istio's injector.
func ignoredNamespaces() []string {
	return []string{"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}
}

// Required decides whether pod gets a sidecar from this injector, and says
// why in a short lower-case phrase. nsLabels are the labels of the pod's
// namespace (nil if it has none).
//
// It makes the decisions Istio's injector makes, including those its
// webhook configuration's selectors make before the injector is called, in
// this order:
//  1. a pod that already carries sidecar.istio.io/status is not injected
//     again;
//  2. host-network pods, the Kubernetes system namespaces and Canopy's own
//     namespace are skipped;
//  3. Canopy's rule: ambient pods are never injected: those labelled
//     istio.io/dataplane-mode=ambient, and those in a namespace so
//     labelled unless the pod says istio.io/dataplane-mode=none;
//  4. sidecar.istio.io/inject=true asks, =false refuses (other values
//     count as unset), the pod label beating the annotation of the same
//     name;
//  5. the namespace label istio-injection=enabled selects the default
//     revision, any other value selects none; else the namespace label
//     istio.io/rev, else the pod label istio.io/rev, names the revision;
//     else only sidecar.istio.io/inject=true selects the default revision.
//     The revision must be this injector's;
//  6. for a pod that neither asks nor refuses, the first
//     NeverInjectSelector that matches its labels refuses, else the first
//     AlwaysInjectSelector that matches injects;
//  7. the policy: enabled injects what is selected; disabled only pods that
//     ask.
func Required(pod *corev1.Pod, nsLabels map[string]string, cfg Config) (bool, string) {
	cfg = cfg.withDefaults()
	if _, ok := pod.Annotations[AnnotationStatus]; ok {
		return false, "pod is already injected (" + AnnotationStatus + ")"
	}
	if pod.Spec.HostNetwork {
		return false, "pod uses the host network"
	}
	if slices.Contains(ignoredNamespaces(), pod.Namespace) {
		return false, fmt.Sprintf("namespace %s is never injected", pod.Namespace)
	}
	if pod.Namespace == cfg.SystemNamespace {
		return false, fmt.Sprintf("namespace %s is Canopy's own", pod.Namespace)
	}

	podMode := pod.Labels[LabelDataplaneMode]
	if podMode == "ambient" {
		return false, "pod is in ambient mode (" + LabelDataplaneMode + "=ambient)"
	}
	if podMode != "none" && nsLabels[LabelDataplaneMode] == "ambient" {
		return false, "namespace is in ambient mode (" + LabelDataplaneMode + "=ambient)"
	}

	// The label is the newer API; it wins over the annotation.
	choice, how := pod.Annotations[AnnotationInject], "annotation"
	if v, ok := pod.Labels[LabelInject]; ok {
		choice, how = v, "label"
	}
	// Only "true" and "false" count; any other value is as if unset.
	explicit := choice == "true"
	if choice == "false" {
		return false, fmt.Sprintf("pod %s %s=false", how, LabelInject)
	}

	rev := cfg.revisionName()
	var selectedBy string
	if v, ok := nsLabels[LabelInjection]; ok {
		if v != "enabled" {
			return false, fmt.Sprintf("namespace label %s=%s", LabelInjection, v)
		}
		if rev != "default" {
			return false, fmt.Sprintf("namespace label %s=enabled selects the default revision, not %s", LabelInjection, rev)
		}
		selectedBy = "namespace label " + LabelInjection + "=enabled"
	} else if v, ok := nsLabels[LabelRev]; ok {
		if v != rev {
			return false, fmt.Sprintf("namespace selects revision %s, not %s", v, rev)
		}
		selectedBy = "namespace label " + LabelRev + "=" + v
	} else if v, ok := pod.Labels[LabelRev]; ok {
		if v != rev {
			return false, fmt.Sprintf("pod selects revision %s, not %s", v, rev)
		}
		selectedBy = "pod label " + LabelRev + "=" + v
	} else if explicit && how == "label" {
		if rev != "default" {
			return false, fmt.Sprintf("pod label %s=true selects the default revision, not %s", LabelInject, rev)
		}
		selectedBy = "pod label " + LabelInject + "=true"
	} else {
		return false, "neither the namespace nor the pod selects a revision"
	}

	if explicit {
		if how == "label" && selectedBy == "pod label "+LabelInject+"=true" {
			return true, selectedBy
		}
		return true, fmt.Sprintf("%s, pod %s %s=true", selectedBy, how, LabelInject)
	}
	if sel, ok := matchingSelector(cfg.NeverInjectSelector, pod.Labels); ok {
		return false, fmt.Sprintf("%s, but the pod matches neverInjectSelector %s", selectedBy, sel)
	}
	if sel, ok := matchingSelector(cfg.AlwaysInjectSelector, pod.Labels); ok {
		return true, fmt.Sprintf("%s, pod matches alwaysInjectSelector %s", selectedBy, sel)
	}
	if cfg.Policy == PolicyDisabled {
		return false, selectedBy + ", but the policy is disabled and the pod does not ask"
	}
	return true, selectedBy
}

// matchingSelector is the first of selectors that matches podLabels. Empty
// selectors match nothing (Istio's injector skips them); Config.Validate
// refuses invalid ones, so one that does not convert is skipped here.
func matchingSelector(selectors []metav1.LabelSelector, podLabels map[string]string) (labels.Selector, bool) {
	for i := range selectors {
		sel, err := metav1.LabelSelectorAsSelector(&selectors[i])
		if err != nil || sel.Empty() {
			continue
		}
		if sel.Matches(labels.Set(podLabels)) {
			return sel, true
		}
	}
	return nil, false
}
