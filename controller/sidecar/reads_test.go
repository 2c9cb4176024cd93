package sidecar

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Functions that build or summarise a Mesh: they read its inputs whole
// and record nothing.
var meshBuilders = []string{"NewMesh", "indexRules", "indexEndpoints", "indexTunnels", "indexFailoverLabels", "fingerprint", "ownSum", "endpointsAt", "DepsOf", "reading"}

// TestGeneratorsReadThroughRecorders: a generator reads a Mesh's inputs
// (its unexported fields, and a Service's Endpoints) only through a
// function that records the read into the generation's Reads, so that
// what a share depends on is derived from what it read. A function that
// reads an input directly must either record (call one of the read*
// methods) or be one that builds or summarises the Mesh. A new input, or
// a generator that reads one directly, fails here rather than serving
// stale shares.
func TestGeneratorsReadThroughRecorders(t *testing.T) {
	inputs := map[string]bool{"Endpoints": true}
	mt := reflect.TypeFor[Mesh]()
	for i := range mt.NumField() {
		if f := mt.Field(i); !f.IsExported() && f.Name != "reads" && f.Name != "fp" {
			inputs[f.Name] = true
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
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
			// The read* methods are the recorders themselves.
			if !ok || fn.Body == nil || slices.Contains(meshBuilders, fn.Name.Name) || strings.HasPrefix(fn.Name.Name, "read") {
				continue
			}
			var direct []string
			records := false
			called := map[*ast.SelectorExpr]bool{} // methods, not fields
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if inputs[x.Sel.Name] && !called[x] && !isCompositeField(x) {
						direct = append(direct, fset.Position(x.Pos()).String()+" ."+x.Sel.Name)
					}
				case *ast.CallExpr:
					sel, ok := x.Fun.(*ast.SelectorExpr)
					if !ok {
						break
					}
					called[sel] = true
					if strings.HasPrefix(sel.Sel.Name, "read") && sel.Sel.Name != "reading" {
						records = true
					}
				}
				return true
			})
			if len(direct) > 0 && !records {
				t.Errorf("%s reads a Mesh's inputs without recording the read (call a read* method, or go through one that does): %v", fn.Name.Name, direct)
			}
		}
	}
}

// isCompositeField reports whether a selector names a field of something
// other than a Mesh or a Service, as far as syntax tells: a generated
// protobuf's Endpoints (cla.Endpoints) is written, not read from a Mesh.
func isCompositeField(x *ast.SelectorExpr) bool {
	id, ok := x.X.(*ast.Ident)
	return ok && x.Sel.Name == "Endpoints" && id.Name == "cla"
}
