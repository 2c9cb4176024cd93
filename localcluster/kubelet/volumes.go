package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/localcluster/containerinit"
)

// volumeSource writes volumes' contents: the API objects they come from
// are read through client when the pod starts (they are not refreshed).
type volumeSource struct {
	client kubernetes.Interface
}

// prepare writes every volume of pod under dir and returns each volume's
// host path by name. hostPath maps a hostPath volume's path to the node's.
func (v volumeSource) prepare(ctx context.Context, pod *corev1.Pod, dir string, hostPath func(string) string) (map[string]string, error) {
	paths := map[string]string{}
	for _, vol := range pod.Spec.Volumes {
		path := filepath.Join(dir, vol.Name)
		var err error
		switch {
		case vol.HostPath != nil:
			path = hostPath(vol.HostPath.Path)
			err = prepareHostPath(path, ptrValue(vol.HostPath.Type))
		case vol.EmptyDir != nil:
			err = os.MkdirAll(path, 0o777)
		case vol.ConfigMap != nil:
			err = v.writeConfigMap(ctx, pod.Namespace, path, vol.ConfigMap.Name, vol.ConfigMap.Items, vol.ConfigMap.Optional)
		case vol.Secret != nil:
			err = v.writeSecret(ctx, pod.Namespace, path, vol.Secret.SecretName, vol.Secret.Items, vol.Secret.Optional)
		case vol.DownwardAPI != nil:
			err = writeDownwardAPI(pod, path, vol.DownwardAPI.Items)
		case vol.Projected != nil:
			err = v.writeProjected(ctx, pod, path, vol.Projected.Sources)
		default:
			err = fmt.Errorf("unsupported volume type (the local cluster supports hostPath, emptyDir, configMap, secret, downwardAPI and projected)")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", vol.Name, err)
		}
		paths[vol.Name] = path
	}
	return paths, nil
}

func prepareHostPath(path string, t corev1.HostPathType) error {
	switch t {
	case corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(path, 0o755)
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	case corev1.HostPathUnset:
		// Like a container runtime: a missing path becomes a directory.
		if _, err := os.Stat(path); err != nil {
			return os.MkdirAll(path, 0o755)
		}
		return nil
	default:
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("hostPath of type %s: %w", t, err)
		}
		return nil
	}
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// writeFiles writes name -> content into dir, creating it.
func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if !strings.HasPrefix(path, dir+string(filepath.Separator)) {
			return fmt.Errorf("file path %q leaves the volume", name)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// selectKeys maps data keys to file paths: all keys, or only the listed
// items under their paths.
func selectKeys(data map[string][]byte, items []corev1.KeyToPath) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = v
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("key %q not found", it.Key)
		}
		out[it.Path] = v
	}
	return out, nil
}

func (v volumeSource) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := v.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && ptrValue(optional) {
		return map[string][]byte{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get configmap %s/%s: %w", ns, name, err)
	}
	data := map[string][]byte{}
	for k, s := range cm.Data {
		data[k] = []byte(s)
	}
	for k, b := range cm.BinaryData {
		data[k] = b
	}
	return selectKeys(data, items)
}

func (v volumeSource) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	s, err := v.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && ptrValue(optional) {
		return map[string][]byte{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", ns, name, err)
	}
	return selectKeys(s.Data, items)
}

func (v volumeSource) writeConfigMap(ctx context.Context, ns, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	files, err := v.configMapFiles(ctx, ns, name, items, optional)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

func (v volumeSource) writeSecret(ctx context.Context, ns, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	files, err := v.secretFiles(ctx, ns, name, items, optional)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

func writeDownwardAPI(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile) error {
	files, err := downwardAPIFiles(pod, items)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

func downwardAPIFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, it := range items {
		if it.FieldRef == nil {
			return nil, fmt.Errorf("downwardAPI item %s: only fieldRef is supported", it.Path)
		}
		val, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return nil, fmt.Errorf("downwardAPI item %s: %w", it.Path, err)
		}
		files[it.Path] = []byte(val)
	}
	return files, nil
}

// fieldValue resolves the pod fields a downward API file may name.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	return "", fmt.Errorf("unsupported field %q", path)
}

// formatMap renders labels or annotations as the kubelet does: sorted
// key="value" lines.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

func (v volumeSource) writeProjected(ctx context.Context, pod *corev1.Pod, dir string, sources []corev1.VolumeProjection) error {
	files := map[string][]byte{}
	for _, src := range sources {
		var part map[string][]byte
		var err error
		switch {
		case src.ServiceAccountToken != nil:
			var token string
			token, err = v.token(ctx, pod, src.ServiceAccountToken)
			part = map[string][]byte{src.ServiceAccountToken.Path: []byte(token)}
		case src.ConfigMap != nil:
			part, err = v.configMapFiles(ctx, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
		case src.Secret != nil:
			part, err = v.secretFiles(ctx, pod.Namespace, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
		case src.DownwardAPI != nil:
			part, err = downwardAPIFiles(pod, src.DownwardAPI.Items)
		default:
			err = fmt.Errorf("unsupported projected source")
		}
		if err != nil {
			return err
		}
		for k, b := range part {
			files[k] = b
		}
	}
	return writeFiles(dir, files)
}

// token mints the pod's service-account token, bound to the pod as a
// kubelet's projected token is.
func (v volumeSource) token(ctx context.Context, pod *corev1.Pod, p *corev1.ServiceAccountTokenProjection) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: p.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
		},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	resp, err := v.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request token for %s/%s: %w", pod.Namespace, sa, err)
	}
	return resp.Status.Token, nil
}

// containerMounts turns a container's volume mounts into bind mounts.
func containerMounts(c *corev1.Container, volumes map[string]string) ([]containerinit.Mount, error) {
	var out []containerinit.Mount
	for _, m := range c.VolumeMounts {
		src, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s: no volume of that name", m.Name)
		}
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
		}
		out = append(out, containerinit.Mount{
			Source:        src,
			Target:        m.MountPath,
			ReadOnly:      m.ReadOnly,
			Bidirectional: ptrValue(m.MountPropagation) == corev1.MountPropagationBidirectional,
		})
	}
	return out, nil
}

// envValue resolves one environment variable of a container in pod, whose
// IPs are ips, on a node at hostIP.
func (v volumeSource) envValue(ctx context.Context, pod *corev1.Pod, ips []string, hostIP string, e corev1.EnvVar) (string, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, nil
	case from.FieldRef != nil:
		switch path := from.FieldRef.FieldPath; path {
		case "status.podIP", "status.podIPs":
			if pod.Spec.HostNetwork {
				return hostIP, nil // a host-network pod's IP is its node's
			}
			if path == "status.podIP" && len(ips) > 0 {
				return ips[0], nil
			}
			return strings.Join(ips, ","), nil
		case "status.hostIP", "status.hostIPs":
			return hostIP, nil
		default:
			if key, ok := subscript(path, "metadata.labels"); ok {
				return pod.Labels[key], nil
			}
			if key, ok := subscript(path, "metadata.annotations"); ok {
				return pod.Annotations[key], nil
			}
			return fieldValue(pod, path)
		}
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := v.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptrValue(ref.Optional) {
				return "", nil
			}
			return "", fmt.Errorf("ConfigMap %s: %w", ref.Name, err)
		}
		val, ok := cm.Data[ref.Key]
		if !ok && !ptrValue(ref.Optional) {
			return "", fmt.Errorf("ConfigMap %s has no key %s", ref.Name, ref.Key)
		}
		return val, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := v.client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptrValue(ref.Optional) {
				return "", nil
			}
			return "", fmt.Errorf("secret %s: %w", ref.Name, err)
		}
		val, ok := s.Data[ref.Key]
		if !ok && !ptrValue(ref.Optional) {
			return "", fmt.Errorf("secret %s has no key %s", ref.Name, ref.Key)
		}
		return string(val), nil
	}
	return "", fmt.Errorf("unsupported valueFrom (the local cluster resolves fieldRef, configMapKeyRef and secretKeyRef)")
}

// subscript reads metadata.labels['key'] and the like.
func subscript(path, field string) (string, bool) {
	rest, ok := strings.CutPrefix(path, field+"['")
	if !ok || !strings.HasSuffix(rest, "']") {
		return "", false
	}
	return strings.TrimSuffix(rest, "']"), true
}

// envSource reads an envFrom source: a ConfigMap's or Secret's data.
func (v volumeSource) envSource(ctx context.Context, namespace string, from corev1.EnvFromSource) (map[string]string, error) {
	out := map[string]string{}
	switch {
	case from.ConfigMapRef != nil:
		cm, err := v.client.CoreV1().ConfigMaps(namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptrValue(from.ConfigMapRef.Optional) {
				return out, nil
			}
			return nil, fmt.Errorf("envFrom ConfigMap %s: %w", from.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := v.client.CoreV1().Secrets(namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptrValue(from.SecretRef.Optional) {
				return out, nil
			}
			return nil, fmt.Errorf("envFrom Secret %s: %w", from.SecretRef.Name, err)
		}
		for k, b := range s.Data {
			out[k] = string(b)
		}
		return out, nil
	}
	return out, nil
}
