// Package chart renders Canopy's Helm chart into Kubernetes objects, the
// way helm template does, for canopyctl install and the tests: values are
// checked against values.schema.json, CRDs come apart from the templated
// objects, and objects come in the order they can be applied.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader/archive"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Options say what to render.
type Options struct {
	// Namespace is the release namespace: where the components run.
	Namespace string
	// ReleaseName names the release; default "canopy".
	ReleaseName string
	// Version, when set, becomes the chart's version and appVersion, so
	// images default to this build's tag.
	Version string
	// Values override values.yaml (a values file's content, parsed).
	Values map[string]any
	// Set are helm-style key=value overrides applied after Values.
	Set []string
}

// Rendered is a rendered chart.
type Rendered struct {
	// CRDs are the chart's crds/ directory, applied before the rest and
	// never templated (as helm does).
	CRDs []*unstructured.Unstructured
	// Objects are the templated objects in apply order.
	Objects []*unstructured.Unstructured
}

// Render renders the chart in chartFS (Chart.yaml at its root).
func Render(chartFS fs.FS, opts Options) (*Rendered, error) {
	if opts.Namespace == "" {
		return nil, errors.New("render chart: a namespace is required")
	}
	if opts.ReleaseName == "" {
		opts.ReleaseName = "canopy"
	}
	ch, err := load(chartFS)
	if err != nil {
		return nil, err
	}
	if opts.Version != "" {
		ch.Metadata.Version = semverOr(opts.Version, ch.Metadata.Version)
		ch.Metadata.AppVersion = opts.Version
	}
	vals := map[string]any{}
	if opts.Values != nil {
		vals = loader.MergeMaps(vals, opts.Values)
	}
	for _, s := range opts.Set {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	top, err := util.ToRenderValuesWithSchemaValidation(ch, vals, common.ReleaseOptions{
		Name: opts.ReleaseName, Namespace: opts.Namespace, IsInstall: true, Revision: 1,
	}, nil, false)
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render chart: %w", err)
	}
	out := &Rendered{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if path.Ext(name) != ".yaml" || strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		objs, err := Decode([]byte(files[name]))
		if err != nil {
			return nil, fmt.Errorf("rendered %s: %w", name, err)
		}
		for _, o := range objs {
			if o.GetNamespace() == "" && namespaced(o.GetKind()) {
				o.SetNamespace(opts.Namespace)
			}
		}
		out.Objects = append(out.Objects, objs...)
	}
	slices.SortStableFunc(out.Objects, func(a, b *unstructured.Unstructured) int {
		return applyRank(a.GetKind()) - applyRank(b.GetKind())
	})
	for _, f := range ch.CRDObjects() {
		objs, err := Decode(f.File.Data)
		if err != nil {
			return nil, fmt.Errorf("CRD file %s: %w", f.Filename, err)
		}
		out.CRDs = append(out.CRDs, objs...)
	}
	return out, nil
}

// ParseValues reads a values file.
func ParseValues(b []byte) (map[string]any, error) {
	vals := map[string]any{}
	if err := yaml.Unmarshal(b, &vals); err != nil {
		return nil, fmt.Errorf("parse values: %w", err)
	}
	return vals, nil
}

// Decode splits YAML documents into objects, skipping empty documents.
func Decode(b []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("a document without kind or apiVersion (name %q)", u.GetName())
		}
		out = append(out, u)
	}
}

// load reads every file of the chart, as helm's directory loader does but
// from an fs.FS (the embedded chart).
func load(chartFS fs.FS) (*chartv2.Chart, error) {
	var files []*archive.BufferedFile
	err := fs.WalkDir(chartFS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) == ".go" {
			return err
		}
		b, err := fs.ReadFile(chartFS, p)
		if err != nil {
			return err
		}
		files = append(files, &archive.BufferedFile{Name: p, Data: b})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read chart: %w", err)
	}
	ch, err := loader.LoadFiles(files)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	return ch, nil
}

// semverOr keeps the chart version valid semver: a build version such as
// "v0.3.1-4-gabc" becomes "0.3.1-4-gabc"; one that is not semver at all
// ("dev", a bare commit) leaves the chart's own.
func semverOr(v, fallback string) string {
	v = strings.TrimPrefix(v, "v")
	if v == "" || v[0] < '0' || v[0] > '9' || strings.Count(strings.SplitN(v, "-", 2)[0], ".") != 2 {
		return fallback
	}
	return v
}

// applyRank orders kinds for applying: what others refer to first, the
// controller before the DaemonSets that need it, unknown kinds last.
func applyRank(kind string) int {
	for i, k := range [...]string{
		"Namespace", "CustomResourceDefinition", "PriorityClass", "ServiceAccount",
		"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ConfigMap", "Secret", "Service", "PodDisruptionBudget",
		"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
	} {
		if k == kind {
			return i
		}
	}
	return 1 << 10
}

func namespaced(kind string) bool {
	switch kind {
	case "Namespace", "CustomResourceDefinition", "PriorityClass", "ClusterRole", "ClusterRoleBinding",
		"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		return false
	}
	return true
}
