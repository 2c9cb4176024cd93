package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
)

// Inject returns the RFC 6902 JSON Patch that turns pod into the injected
// pod (see Mutate), or nil when pod already carries sidecar.istio.io/status
// and so must not be injected again. The caller decides with Required
// whether to inject at all. pod is not modified.
func Inject(pod *corev1.Pod, cfg Config) ([]byte, error) {
	if _, ok := pod.Annotations[AnnotationStatus]; ok {
		return nil, nil
	}
	// managedFields do not change and can be large; leave them out of
	// the diff, as Istio's injector does.
	orig := pod.DeepCopy()
	orig.ManagedFields = nil
	injected, err := Mutate(orig, cfg)
	if err != nil {
		return nil, err
	}
	before, err := json.Marshal(orig)
	if err != nil {
		return nil, fmt.Errorf("marshal pod: %w", err)
	}
	after, err := json.Marshal(injected)
	if err != nil {
		return nil, fmt.Errorf("marshal injected pod: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("diff injected pod: %w", err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("marshal patch: %w", err)
	}
	return patch, nil
}

// Mutate returns a copy of pod with the template named by its
// inject.istio.io/templates annotation (default "sidecar") applied, or an
// unchanged copy when pod already carries sidecar.istio.io/status. It
// refuses (with a *RefusedError) pods that carry annotations Canopy does
// not honour, and fails on invalid annotation values, unknown templates
// (ErrUnknownTemplate) and pods that already define a container or volume
// the template adds. pod is not modified.
func Mutate(pod *corev1.Pod, cfg Config) (*corev1.Pod, error) {
	// Rendering needs the image, whatever DenyReason says.
	cfg.DenyReason = ""
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	out := pod.DeepCopy()
	if _, ok := pod.Annotations[AnnotationStatus]; ok {
		return out, nil
	}
	if err := checkAnnotations(pod.Annotations); err != nil {
		return nil, err
	}
	tmpl, err := templateName(pod)
	if err != nil {
		return nil, err
	}
	p, err := newParams(pod, cfg)
	if err != nil {
		return nil, err
	}
	inj, err := render(tmpl, p)
	if err != nil {
		return nil, err
	}
	if err := apply(out, inj); err != nil {
		return nil, err
	}

	rewrite := !cfg.DisableAppProbeRewrite
	if v, err := strconv.ParseBool(out.Annotations[AnnotationRewriteProbes]); err == nil {
		rewrite = v
	}
	if port, _ := strconv.ParseInt(p.statusPort, 10, 32); rewrite && port != 0 {
		if err := rewriteProbes(out, int32(port)); err != nil {
			return nil, err
		}
	}

	status, err := statusAnnotation(inj, cfg.revisionName())
	if err != nil {
		return nil, err
	}
	out.Annotations[AnnotationStatus] = status
	reorder(out, p.hold)
	return out, nil
}

// templateName is the pod's one template. Istio can stack several
// templates; Canopy renders exactly one.
func templateName(pod *corev1.Pod) (string, error) {
	v, ok := pod.Annotations[AnnotationTemplates]
	if !ok {
		return TemplateSidecar, nil
	}
	names := splitList(v)
	switch {
	case len(names) == 0:
		return "", fmt.Errorf("annotation %s=%q names no template", AnnotationTemplates, v)
	case len(names) > 1:
		return "", fmt.Errorf("annotation %s=%q: Canopy applies exactly one template", AnnotationTemplates, v)
	}
	switch names[0] {
	case TemplateSidecar, TemplateGRPCAgent:
		return names[0], nil
	}
	return "", fmt.Errorf("annotation %s: %w %q (known: %s, %s)", AnnotationTemplates, ErrUnknownTemplate, names[0], TemplateSidecar, TemplateGRPCAgent)
}

func newParams(pod *corev1.Pod, cfg Config) (*params, error) {
	pcAnno, hasPC := pod.Annotations[AnnotationProxyConfig]
	pc, err := proxyConfig(pcAnno, hasPC, cfg)
	if err != nil {
		return nil, err
	}
	pcJS, err := proxyConfigJSON(pc)
	if err != nil {
		return nil, err
	}
	p := &params{
		cfg:        cfg,
		pod:        pod,
		pc:         pc,
		pcJS:       pcJS,
		image:      proxyImage(cfg.Hub, cfg.Tag, pod.Annotations[AnnotationProxyImageType]),
		statusPort: annotationOr(pod, AnnotationStatusPort, defaultStatusPort),
		native:     cfg.NativeSidecars,
		network:    firstNonEmpty(pod.Labels[LabelNetwork], cfg.Network),
		deploy:     podDeployMeta(pod),
	}
	if img := pod.Annotations[AnnotationProxyImage]; strings.Contains(img, "/") {
		p.image = img
	}
	if v, ok := pod.Annotations[AnnotationNativeSidecar]; ok {
		// As in Istio's template, any value but "false" turns it on.
		p.native = v != "false"
	}
	p.hold = !p.native && (cfg.HoldApplicationUntilProxyStarts || pc.GetHoldApplicationUntilProxyStarts().GetValue())
	for _, c := range pod.Spec.Containers {
		if c.Name == ProxyContainer {
			return nil, fmt.Errorf("pod already defines container %s; Canopy does not merge user settings into the injected proxy", ProxyContainer)
		}
		p.apps = append(p.apps, c.Name)
	}
	return p, nil
}

// apply adds inj to pod.
func apply(pod *corev1.Pod, inj *injection) error {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range inj.labels {
		pod.Labels[k] = v
	}
	for k, v := range inj.annotations {
		pod.Annotations[k] = v
	}
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for _, c := range slices.Concat(inj.initContainers, inj.containers) {
		if slices.ContainsFunc(all, func(o corev1.Container) bool { return o.Name == c.Name }) {
			return fmt.Errorf("pod already defines container %s, which injection adds", c.Name)
		}
	}
	for _, v := range inj.volumes {
		if slices.ContainsFunc(pod.Spec.Volumes, func(o corev1.Volume) bool { return o.Name == v.Name }) {
			return fmt.Errorf("pod already defines volume %s, which injection adds", v.Name)
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		for _, e := range inj.appEnv {
			if j := slices.IndexFunc(c.Env, func(o corev1.EnvVar) bool { return o.Name == e.Name }); j >= 0 {
				c.Env[j] = e
			} else {
				c.Env = append(c.Env, e)
			}
		}
		for _, m := range inj.appMounts {
			if j := slices.IndexFunc(c.VolumeMounts, func(o corev1.VolumeMount) bool { return o.MountPath == m.MountPath }); j >= 0 {
				c.VolumeMounts[j] = m
			} else {
				c.VolumeMounts = append(c.VolumeMounts, m)
			}
		}
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, inj.initContainers...)
	pod.Spec.Containers = append(pod.Spec.Containers, inj.containers...)
	pod.Spec.Volumes = append(pod.Spec.Volumes, inj.volumes...)
	return nil
}

// status is the value of sidecar.istio.io/status: what injection added,
// so tools (and istio-cni, and Canopy's CNI agent) recognise an injected
// pod.
type status struct {
	InitContainers   []string `json:"initContainers"`
	Containers       []string `json:"containers"`
	Volumes          []string `json:"volumes"`
	ImagePullSecrets []string `json:"imagePullSecrets"`
	Revision         string   `json:"revision"`
}

func statusAnnotation(inj *injection, revision string) (string, error) {
	s := status{Revision: revision}
	for _, c := range inj.initContainers {
		s.InitContainers = append(s.InitContainers, c.Name)
	}
	for _, c := range inj.containers {
		s.Containers = append(s.Containers, c.Name)
	}
	for _, v := range inj.volumes {
		s.Volumes = append(s.Volumes, v.Name)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("marshal injection status: %w", err)
	}
	return string(b), nil
}

// reorder puts the injected containers where Istio's injector puts them.
// istio-proxy goes last among the containers, so kubectl exec and logs
// default to the application, or first when the applications wait for
// it. As a native sidecar it goes first among the init containers, after
// only istio-init or istio-validation, so that the other init containers
// are in the mesh. Otherwise istio-validation runs first, and istio-init
// last so that the other init containers run before redirection.
func reorder(pod *corev1.Pod, hold bool) {
	if hold {
		pod.Spec.Containers = moveFirst(pod.Spec.Containers, ProxyContainer)
	} else {
		pod.Spec.Containers = moveLast(pod.Spec.Containers, ProxyContainer)
	}
	ic := pod.Spec.InitContainers
	if slices.ContainsFunc(ic, func(c corev1.Container) bool { return c.Name == ProxyContainer }) {
		ic = moveFirst(ic, ProxyContainer)
		ic = moveFirst(ic, ValidationContainer)
		ic = moveFirst(ic, InitContainer)
	} else {
		ic = moveFirst(ic, ValidationContainer)
		ic = moveLast(ic, InitContainer)
	}
	pod.Spec.InitContainers = ic
}

func moveFirst(cs []corev1.Container, name string) []corev1.Container {
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == name })
	if i <= 0 {
		return cs
	}
	c := cs[i]
	return slices.Insert(slices.Delete(cs, i, i+1), 0, c)
}

func moveLast(cs []corev1.Container, name string) []corev1.Container {
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 || i == len(cs)-1 {
		return cs
	}
	c := cs[i]
	return append(slices.Delete(cs, i, i+1), c)
}
