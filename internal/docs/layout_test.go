package docs

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
