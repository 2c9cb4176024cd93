package index

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadsGoThroughTheViews holds the package to what its change
// detection assumes: namespaces and nodes are read only through the views
// that record the keys read (reads.go), or by the updates that store them;
// the sidecar parts are read only by sidecarParts' own methods, which
// assemble SidecarInputs. A recompute that read a namespace's labels
// directly, or a SidecarInputs that read a pod, would go stale silently.
func TestReadsGoThroughTheViews(t *testing.T) {
	allowed := map[string][]string{
		"namespaces": {"DeleteNamespace", "NamespaceLabels", "UpsertNamespace", "namespaceView"},
		"nodes":      {"DeleteNode", "UpsertNode", "nodeView"},
		// setTraffic and the updates store parts through the set* helpers.
		"sidecar": {"DeletePeerAuthentication", "DeletePod", "DeleteWorkloadEntry", "SidecarInputs", "UpsertDestinationRule",
			"DeleteDestinationRule", "UpsertPeerAuthentication", "UpsertPod", "UpsertSidecar", "DeleteSidecar",
			"UpsertVirtualService", "DeleteVirtualService", "UpsertWorkloadEntry", "policyChanged", "serviceChanged",
			"serviceEntryChanged"},
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || isRecv(fn, "sidecarParts") {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "x" && allowed[sel.Sel.Name] != nil &&
					!slices.Contains(got[sel.Sel.Name], fn.Name.Name) {
					got[sel.Sel.Name] = append(got[sel.Sel.Name], fn.Name.Name)
				}
				return true
			})
		}
	}
	for field, fns := range allowed {
		slices.Sort(fns)
		slices.Sort(got[field])
		if diff := cmp.Diff(fns, got[field]); diff != "" {
			t.Errorf("functions that use x.%s (-allowed +found); read through the views in reads.go or sidecar_parts.go:\n%s", field, diff)
		}
	}
}

func isRecv(fn *ast.FuncDecl, typ string) bool {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return false
	}
	star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	id, ok := star.X.(*ast.Ident)
	return ok && id.Name == typ
}
