package docs

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/sandwake/sandwake"

// TestDesignDependencies: the dependency list of docs/DESIGN.md ("Layout")
// is every project import of every package, as go list sees them, and every
// package has a doc.go saying what it owns.
func TestDesignDependencies(t *testing.T) {
	root := filepath.Join("..", "..")
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	want := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, rest, _ := strings.Cut(sc.Text(), "|")
		dir, imports, _ := strings.Cut(rest, "|")
		name := short(path)
		var deps []string
		for _, imp := range strings.Fields(imports) {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				deps = append(deps, short(imp))
			}
		}
		slices.Sort(deps)
		want[name] = strings.Join(deps, ", ")
		if want[name] == "" {
			want[name] = "(none)"
		}
		if _, err := os.Stat(filepath.Join(dir, "doc.go")); err != nil {
			t.Errorf("package %s has no doc.go", name)
		}
	}
	design, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(design), "Dependencies flow one way")
	if !ok {
		t.Fatal(`docs/DESIGN.md has no "Dependencies flow one way" list`)
	}
	_, block, _ := strings.Cut(after, "```\n")
	block, _, _ = strings.Cut(block, "```")
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		name, deps, ok := strings.Cut(line, "→")
		if !ok {
			t.Errorf("DESIGN.md dependency line %q has no →", line)
			continue
		}
		got[strings.TrimSpace(name)] = strings.TrimSpace(deps)
	}
	for name, deps := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("DESIGN.md lists no dependencies of %s; go list: %s → %s", name, name, deps)
		} else if g != deps {
			t.Errorf("DESIGN.md: %s → %s; go list: %s → %s", name, g, name, deps)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("DESIGN.md lists %s, which is not a package", name)
		}
	}
}

// short is a package's path in the module ("(root)" for the module's own).
func short(path string) string {
	if path == module {
		return "(root)"
	}
	return strings.TrimPrefix(path, module+"/")
}

// quotedPath is a back-quoted path of the repository in Markdown: a
// directory and a file name with an extension, or a Go test named after its
// package (`preview/TestChurnNoBare502`).
var quotedPath = regexp.MustCompile("`((?:[a-z][a-z0-9_-]*/)+)([A-Za-z0-9_.-]+\\.(?:go|md|html|json|yaml|sh)|Test[A-Za-z0-9_]+)`")

// TestQuotedPathsExist: every file of this repository a doc names in back
// quotes exists, and
// every test it names by package exists in that package, so that a move
// (the rooms issue moved most of caddymodule) cannot leave a doc pointing
// at nothing.
func TestQuotedPathsExist(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, md := range markdownFiles(t, root) {
		raw, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range quotedPath.FindAllStringSubmatch(string(raw), -1) {
			dir, name := m[1], m[2]
			top, _, _ := strings.Cut(dir, "/")
			if _, err := os.Stat(filepath.Join(root, top)); err != nil {
				continue // another project's path (Sablier's pkg/sablier/…)
			}
			p := filepath.Join(root, dir, name)
			if strings.HasPrefix(name, "Test") {
				if !hasTest(t, filepath.Join(root, dir), name) {
					t.Errorf("%s names %s%s: no such test in %s", rel(root, md), dir, name, dir)
				}
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s names %s%s, which does not exist", rel(root, md), dir, name)
			}
		}
	}
}

// hasTest reports whether a _test.go file of dir declares func name.
func hasTest(t *testing.T, dir, name string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("func "+name+"(")) {
			return true
		}
	}
	return false
}
