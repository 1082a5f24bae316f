package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// markdownLink is a Markdown link's target (not an image's).
var markdownLink = regexp.MustCompile(`(?m)(?:^|[^!])\[[^\]]*\]\(([^)\s]+)\)`)

// headingSlug is GitHub's anchor of a heading: lower case, punctuation
// but - and _ dropped, spaces as -.
func headingSlug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if h, ok := strings.CutPrefix(line, "#"); ok && !inCode {
			h = strings.TrimLeft(h, "#")
			out[headingSlug(strings.ReplaceAll(h, "`", ""))] = true
		}
	}
	return out
}

// markdownFiles are the repository's Markdown files (the README, docs/*.md
// and any other), but those of hidden directories and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The documentation itself: a walk that found less went wrong.
	for _, want := range []string{"README.md", "docs/api.md", "docs/caddyfile.md", "docs/cluster.md", "docs/operations.md", "docs/security.md", "docs/DESIGN.md"} {
		if !slices.Contains(files, filepath.Join(root, want)) {
			t.Fatalf("%s is not among the Markdown files found: %v", want, files)
		}
	}
	return files
}

// TestDocumentationLinksLive: every relative link in the repository's
// Markdown files (the README, docs/ and any other) names a file of the repository, and every #anchor a heading of
// the file it points into. (External links are not fetched: the tests
// reach nothing but loopback.)
func TestDocumentationLinksLive(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	for _, f := range markdownFiles(t, root) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := f
			if file != "" {
				dest = filepath.Join(filepath.Dir(f), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %v", rel(root, f), target, err)
					continue
				}
			}
			checked++
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", rel(root, f), target, rel(root, dest), anchor)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d links checked", checked)
	}
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}
