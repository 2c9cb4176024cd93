package docs_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/canopy-mesh/canopy/internal/tools"
)

// codeSpan is a Markdown code span: where the docs write paths.
var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// repoPath is a code span that looks like a path in the repository: a
// folder, a file, a glob or a package's identifier (node/pods.Workloads).
var repoPath = regexp.MustCompile(`^[a-z][a-z0-9_-]*(/[A-Za-z0-9_.*-]+)*/?$`)

// repo is the module root and its tracked files.
type repo struct {
	root  string
	files []string // slash-separated, relative to root
}

func openRepo(t *testing.T) repo {
	t.Helper()
	root, err := tools.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (the checks read the tracked files)", err)
	}
	return repo{root: root, files: strings.Fields(string(out))}
}

// docs are the tracked Markdown files that describe the repository: the
// READMEs and docs/ (not test data).
func (r repo) docs() []string {
	var out []string
	for _, f := range r.files {
		if strings.HasSuffix(f, ".md") && !strings.Contains(f, "/testdata/") && !strings.HasPrefix(f, "tools/") {
			out = append(out, f)
		}
	}
	return out
}

// topFolders are the folders at the root that hold tracked files.
func (r repo) topFolders() []string {
	var out []string
	for _, f := range r.files {
		if i := strings.IndexByte(f, '/'); i > 0 && !strings.HasPrefix(f, ".") && !slices.Contains(out, f[:i]) {
			out = append(out, f[:i])
		}
	}
	slices.Sort(out)
	return out
}

// packages are the folders that hold Go files, test data aside.
func (r repo) packages() []string {
	var out []string
	for _, f := range r.files {
		d := path.Dir(f)
		if strings.HasSuffix(f, ".go") && d != "." && !strings.Contains(f, "/testdata/") && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// exists reports whether p, relative to dir (or to the root), names a
// file, a folder, files of a glob, a package pattern (ca/...) or a
// package's identifier.
func (r repo) exists(dir, p string) bool {
	p = strings.TrimSuffix(p, "/...")
	for _, base := range []string{dir, "."} {
		full := filepath.Join(r.root, base, strings.TrimSuffix(p, "/"))
		if m, _ := filepath.Glob(full); len(m) > 0 {
			return true
		}
		// pkg/path.Identifier: the package's folder.
		last := strings.LastIndexByte(full, '/')
		if i := strings.IndexByte(full[last+1:], '.'); i > 0 {
			if st, err := os.Stat(full[:last+1+i]); err == nil && st.IsDir() {
				return true
			}
		}
	}
	return false
}

// TestDocPathsExist: every code span of the docs that starts with one of
// the repository's top folders names something that exists, relative to
// the root or to the document's folder.
func TestDocPathsExist(t *testing.T) {
	r := openRepo(t)
	tops := r.topFolders()
	for _, doc := range r.docs() {
		b, err := os.ReadFile(filepath.Join(r.root, doc))
		if err != nil {
			t.Fatal(err)
		}
		dir := path.Dir(doc)
		for _, m := range codeSpan.FindAllStringSubmatch(string(b), -1) {
			p := m[1]
			if !repoPath.MatchString(p) || !strings.Contains(p, "/") {
				continue
			}
			top, _, _ := strings.Cut(p, "/")
			_, err := os.Stat(filepath.Join(r.root, dir, top))
			if !slices.Contains(tops, top) && err != nil {
				continue // not a path of the repository (a namespace/name, an image)
			}
			if !r.exists(dir, p) {
				t.Errorf("%s names `%s`, which does not exist", doc, p)
			}
		}
	}
}

// TestLayoutTableNamesEveryPackage: the README's layout table names every
// top folder in its first column, and every package either in the table
// (its path, or its path below a folder of the row) or in the README of a
// folder above it (its path below that folder).
func TestLayoutTableNamesEveryPackage(t *testing.T) {
	r := openRepo(t)
	rows := layoutRows(t, r)
	var firstCells []string
	for _, row := range rows {
		firstCells = append(firstCells, row.folders...)
	}
	for _, top := range r.topFolders() {
		if !slices.ContainsFunc(firstCells, func(f string) bool { return f == top || strings.HasPrefix(f, top+"/") }) {
			t.Errorf("README.md's layout table has no row for the folder %s/", top)
		}
	}
	for _, pkg := range r.packages() {
		if !r.named(rows, pkg) {
			t.Errorf("package %s is named neither in README.md's layout table nor in a README of a folder above it", pkg)
		}
	}
}

// layoutRow is a row of the layout table: the folders of its first cell
// and the code spans of the whole row.
type layoutRow struct {
	folders []string
	spans   []string
}

func layoutRows(t *testing.T, r repo) []layoutRow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n## Repository layout\n")
	if !ok {
		t.Fatal("README.md has no section \"Repository layout\"")
	}
	var rows []layoutRow
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.Trim(cells[1], " -") == "" {
			continue
		}
		var row layoutRow
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			row.folders = append(row.folders, strings.TrimSuffix(m[1], "/"))
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			row.spans = append(row.spans, strings.TrimSuffix(m[1], "/"))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatal("README.md's layout table has no rows")
	}
	return rows
}

// named reports whether the layout table or a README above pkg names it.
func (r repo) named(rows []layoutRow, pkg string) bool {
	for _, row := range rows {
		if slices.Contains(row.spans, pkg) {
			return true
		}
		for _, f := range row.folders {
			if rel, ok := strings.CutPrefix(pkg, f+"/"); ok && slices.Contains(row.spans, rel) {
				return true
			}
		}
	}
	for dir := path.Dir(pkg); dir != "."; dir = path.Dir(dir) {
		b, err := os.ReadFile(filepath.Join(r.root, dir, "README.md"))
		if err != nil {
			continue
		}
		rel := strings.TrimPrefix(pkg, dir+"/")
		for _, m := range codeSpan.FindAllStringSubmatch(string(b), -1) {
			if s := strings.TrimSuffix(m[1], "/"); s == rel || s == pkg {
				return true
			}
		}
	}
	return false
}
