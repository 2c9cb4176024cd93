package ctl

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/tools"
)

// TestHelmInstallUpgradeUninstall installs the chart with the real helm
// CLI, as most users install a mesh: helm applies exactly the objects
// canopyctl renders (helm get manifest against canopyctl's rendering, field
// by field) and the API server holds each of them; helm upgrade changes a
// value in place; helm uninstall removes every object of the release,
// cluster-wide ones too (the CRDs stay, as helm keeps them).
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	testenv.Need(t, env)
	dir, err := tools.Dir("helm")
	if err != nil {
		ci.Unavailable(t, "helm: %v", err)
	}
	root, err := tools.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "helm", nil)
	home := t.TempDir()
	helm := func(args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), filepath.Join(dir, "helm"), append(args, "--namespace", ns, "--kubeconfig", env.KubeconfigPath)...)
		// helm's configuration, cache and data of its own.
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home, "XDG_DATA_HOME="+home)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	chartDir := filepath.Join(root, "deploy", "charts", "canopy")
	if out, err := helm("install", "canopy", chartDir); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_, _ = helm("uninstall", "canopy")
		}
	})

	// canopyctl's rendering of the chart as it stands in the directory
	// (its Chart.yaml's appVersion is the image tag).
	r, err := RenderChart(InstallOptions{Namespace: ns, Version: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm("get", "manifest", "canopy")
	if err != nil {
		t.Fatalf("helm get manifest: %v\n%s", err, manifest)
	}
	applied, err := decodeObjects(manifest)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*unstructured.Unstructured{}
	for _, o := range r.Objects {
		want[objectKey(o)] = o
	}
	got := map[string]*unstructured.Unstructured{}
	for _, o := range applied {
		got[objectKey(o)] = o
	}
	t.Logf("helm applied %d objects, canopyctl renders %d", len(got), len(want))
	if diff := cmp.Diff(keys(want), keys(got)); diff != "" {
		t.Errorf("objects helm applied differ from canopyctl's (-canopyctl +helm):\n%s", diff)
	}
	for k, o := range want {
		if h, ok := got[k]; ok {
			if diff := cmp.Diff(o.Object, h.Object); diff != "" {
				t.Errorf("%s differs (-canopyctl +helm):\n%s", k, diff)
			}
		}
	}

	dyn, mapper := dynamicClient(t)
	live := func(ctx context.Context, o *unstructured.Unstructured) error {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			return err
		}
		ri := dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			_, err = ri.Namespace(ns).Get(ctx, o.GetName(), metav1.GetOptions{})
		} else {
			_, err = ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		}
		return err
	}
	for _, o := range r.Objects {
		if err := live(t.Context(), o); err != nil {
			t.Errorf("%s after helm install: %v", objectKey(o), err)
		}
	}

	if out, err := helm("upgrade", "canopy", chartDir, "--set", "controller.replicas=3"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	d, err := env.Client.AppsV1().Deployments(ns).Get(t.Context(), "canopy-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("after helm upgrade --set controller.replicas=3 the controller has %v replicas", d.Spec.Replicas)
	}

	if out, err := helm("uninstall", "canopy"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	uninstalled = true
	for _, o := range r.Objects {
		eventually.Within(t, 30*time.Second, objectKey(o)+" gone after helm uninstall", func() bool {
			return apierrors.IsNotFound(live(t.Context(), o))
		})
	}
	for _, c := range r.CRDs {
		if err := live(t.Context(), c); err != nil {
			t.Errorf("CRD %s after helm uninstall: %v (helm keeps CRDs)", c.GetName(), err)
		}
	}
}

// decodeObjects parses a multi-document YAML stream into objects, skipping
// empty documents.
func decodeObjects(s string) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// objectKey names an object by API version, kind, namespace ("-" for
// none) and name.
func objectKey(o *unstructured.Unstructured) string {
	n := o.GetNamespace()
	if n == "" {
		n = "-"
	}
	return o.GetAPIVersion() + " " + o.GetKind() + " " + n + "/" + o.GetName()
}

func keys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// dynamicClient is a dynamic client of the test's API server and a mapper
// of its kinds to resources.
func dynamicClient(t *testing.T) (dynamic.Interface, meta.RESTMapper) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}
