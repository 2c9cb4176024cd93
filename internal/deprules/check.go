package deprules

import (
	"fmt"
	"slices"
	"strings"
)

// Package is what the check needs of one package: its import path, whether
// it is in the standard library, and its transitive dependencies.
type Package struct {
	ImportPath string
	Standard   bool
	Deps       []string
}

// Violation is one forbidden dependency.
type Violation struct {
	Package, Dep, Reason string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s depends on %s: %s", v.Package, v.Dep, v.Reason)
}

// Check applies rules to pkgs. std reports whether an import path is in the
// standard library (allowlists always admit it).
func Check(pkgs []Package, rules []Rule, std func(string) bool) []Violation {
	var out []Violation
	for _, p := range pkgs {
		for _, r := range rules {
			if !matchesAny(p.ImportPath, r.Packages) || matchesAny(p.ImportPath, r.Except) {
				continue
			}
			for _, d := range p.Deps {
				if d == p.ImportPath {
					continue
				}
				if forbidden(d, r, std) {
					out = append(out, Violation{Package: p.ImportPath, Dep: d, Reason: r.Reason})
				}
			}
		}
	}
	return out
}

func forbidden(dep string, r Rule, std func(string) bool) bool {
	if matchesAny(dep, r.Forbid) {
		return true
	}
	if len(r.Allow) == 0 || std(dep) || isVendoredStd(dep) {
		return false
	}
	return !matchesAny(dep, r.Allow)
}

func matchesAny(path string, patterns []string) bool {
	return slices.ContainsFunc(patterns, func(pat string) bool { return matches(path, pat) })
}

// isVendoredStd reports the standard library's own vendored packages.
func isVendoredStd(path string) bool {
	return strings.HasPrefix(path, "vendor/") || strings.HasPrefix(path, "golang.org/toolchain")
}
