package deprules

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCheckFindsViolations(t *testing.T) {
	t.Parallel()
	std := func(p string) bool { return !strings.Contains(p, ".") }
	m := Module
	pkgs := []Package{
		{ImportPath: m + "/node/proxy", Deps: []string{"fmt", m + "/workloadapi", "k8s.io/client-go/kubernetes"}},
		{ImportPath: m + "/nodeish", Deps: []string{"k8s.io/client-go/kubernetes"}}, // a prefix, not below node/
		{ImportPath: m + "/workloadapi", Deps: []string{"net/netip", "google.golang.org/protobuf/proto", "github.com/pkg/errors"}},
		{ImportPath: m + "/ca", Deps: []string{m + "/internal/testing/testenv"}},
		{ImportPath: m + "/internal/testing/testenv", Deps: []string{m + "/internal/testing/ci"}}, // helpers may use each other
		{ImportPath: m + "/localcluster", Deps: []string{m + "/internal/testing/testenv"}},        // a development tool on the test environment
		{ImportPath: m + "/ctl", Deps: []string{m + "/localcluster"}},
	}
	got := Check(pkgs, Rules, std)
	want := []Violation{
		{Package: m + "/node/proxy", Dep: "k8s.io/client-go/kubernetes", Reason: "the node proxy learns everything over xDS, ZDS and the CA API"},
		{Package: m + "/workloadapi", Dep: "github.com/pkg/errors", Reason: "every binary links the wire types, so they stay dependency-free"},
		{Package: m + "/ca", Dep: m + "/internal/testing/testenv", Reason: "test helpers are for tests only"},
		{Package: m + "/ctl", Dep: m + "/localcluster", Reason: "the local cluster is a development tool; only canopy-local links it"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Check() mismatch (-want +got):\n%s", diff)
	}
}

// TestModuleFollowsRules checks the real module: every package against
// Rules, every binary against its own rules, and every binary is known.
func TestModuleFollowsRules(t *testing.T) {
	t.Parallel()
	pkgs := goList(t, Module+"/...")
	stdSet := map[string]bool{}
	for _, p := range goList(t, "std") {
		stdSet[p.ImportPath] = true
	}
	std := func(p string) bool { return stdSet[p] }

	for _, v := range Check(pkgs, Rules, std) {
		t.Error(v)
	}
	for _, p := range pkgs {
		rest, ok := strings.CutPrefix(p.ImportPath, Module+"/cmd/")
		if !ok || strings.Contains(rest, "/") {
			continue
		}
		rules, known := Binaries[rest]
		if !known {
			t.Errorf("binary cmd/%s has no entry in deprules.Binaries: add its dependency rules", rest)
			continue
		}
		for _, v := range Check([]Package{p}, rules, std) {
			t.Error(v)
		}
	}
	for name := range Binaries {
		if !containsPath(pkgs, path.Join(Module, "cmd", name)) {
			t.Errorf("deprules.Binaries lists %s, which is not under cmd/", name)
		}
	}
}

func containsPath(pkgs []Package, p string) bool {
	for _, x := range pkgs {
		if x.ImportPath == p {
			return true
		}
	}
	return false
}

func goList(t *testing.T, pattern string) []Package {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-json=ImportPath,Standard,Deps", pattern)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %s listed nothing", pattern)
	}
	return pkgs
}
