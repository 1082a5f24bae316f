package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sandwake/sandwake/caddymodule"
)

// snippetEnv are the example values of the {$VAR} placeholders the
// snippets use without a default; the adapter replaces them from the
// environment when it reads a Caddyfile.
var snippetEnv = map[string]string{
	"SANDWAKE_NODE":      "node-a",
	"SANDWAKE_ADVERTISE": "10.0.0.11",
}

// stubDNSProvider stands in for a DNS provider plugin the documentation
// names but this build does not have (it is built in with xcaddy): it takes
// any arguments and block.
type stubDNSProvider struct{ name string }

// CaddyModule implements caddy.Module.
func (p stubDNSProvider) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: caddy.ModuleID("dns.providers." + p.name), New: func() caddy.Module { return &stubDNSProvider{name: p.name} }}
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler.
func (p *stubDNSProvider) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for d.Next() {
	}
	return nil
}

// stubDNSProviders are the plugins stood in for.
var stubDNSProviders = []string{"cloudflare"}

func init() {
	for _, name := range stubDNSProviders {
		caddy.RegisterModule(stubDNSProvider{name: name})
	}
}

// fencedBlock is a fenced code block of a Markdown file.
type fencedBlock struct {
	file string // relative to the repository
	line int    // of the opening fence
	lang string // the fence's info string
	text string
}

// fencedBlocks are the fenced code blocks of the repository's Markdown
// files.
func fencedBlocks(t *testing.T) []fencedBlock {
	t.Helper()
	root := filepath.Join("..", "..")
	var blocks []fencedBlock
	for _, f := range markdownFiles(t, root) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cur *fencedBlock
		for i, line := range strings.Split(string(raw), "\n") {
			fence, ok := strings.CutPrefix(line, "```")
			switch {
			case ok && cur == nil:
				cur = &fencedBlock{file: rel(root, f), line: i + 1, lang: strings.TrimSpace(fence)}
			case ok:
				blocks = append(blocks, *cur)
				cur = nil
			case cur != nil:
				cur.text += line + "\n"
			}
		}
		if cur != nil {
			t.Errorf("%s:%d: the fence is never closed", cur.file, cur.line)
		}
	}
	return blocks
}

// envPlaceholder is a {$VAR} or {$VAR:default} of a Caddyfile.
var envPlaceholder = regexp.MustCompile(`\{\$([A-Za-z_][A-Za-z0-9_]*)(:[^}]*)?\}`)

// looksLikeCaddyfile reports whether a block uses sandwake's Caddyfile
// words: its global option or a directive.
var looksLikeCaddyfile = regexp.MustCompile(`(?m)^\s*(sandwake|sandwake_api|sandwake_preview)(\s+\{|\s*$)`)

// TestCaddyfileSnippetsAdapt: every ```caddyfile block of the repository's
// Markdown files (the README, docs/*.md and any other) adapts with the caddyfile adapter of this build (Caddy's
// standard modules and sandwake's, as cmd/caddy has them), so that no
// example a reader copies is refused. The rules for snippets that are not
// a whole Caddyfile, applied the same way to every block:
//
//   - A block whose first token contains none of . : / * { (it cannot be a
//     site address such as example.com, :8080, http://… or *.preview…, nor
//     the global options block) is the inside of a site, e.g. a directive
//     with its block: it is adapted wrapped in "http://localhost { … }".
//     Any other block is adapted as written (a global options block alone,
//     or sites alone, is a complete Caddyfile).
//   - {$VAR} placeholders are set to the example values of snippetEnv (one
//     missing there fails the test); {$VAR:default} ones are unset so that
//     the default applies whatever the shell sets. {env.VAR} is read at run
//     time, not by the adapter.
//   - A DNS provider plugin a snippet names (stubDNSProviders; built in with
//     xcaddy) is a stub that takes any arguments.
//   - Warnings fail the test, but the one that the input is not formatted
//     as `caddy fmt` would (the snippets align their comments).
//
// A block that uses sandwake's Caddyfile words but is fenced otherwise
// fails the test: fenced as caddyfile, it is checked.
func TestCaddyfileSnippetsAdapt(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("no caddyfile adapter registered")
	}
	adapted := 0
	for _, b := range fencedBlocks(t) {
		where := fmt.Sprintf("%s:%d", b.file, b.line)
		if !strings.EqualFold(b.lang, "caddyfile") {
			if looksLikeCaddyfile.MatchString(b.text) {
				t.Errorf("%s: a Caddyfile fenced as %q: fence it as caddyfile", where, b.lang)
			}
			continue
		}
		if b.lang != "caddyfile" {
			t.Errorf("%s: fenced as %q: write caddyfile", where, b.lang)
		}
		t.Run(where, func(t *testing.T) {
			for _, m := range envPlaceholder.FindAllStringSubmatch(b.text, -1) {
				name, hasDefault := m[1], m[2] != ""
				switch v, ok := snippetEnv[name]; {
				case hasDefault:
					unsetenv(t, name)
				case ok:
					t.Setenv(name, v)
				default:
					t.Fatalf("{$%s} has no example value: add one to snippetEnv", name)
				}
			}
			// Blank lines in front, so that the adapter's line numbers
			// are the Markdown file's.
			body := strings.Repeat("\n", b.line) + b.text
			if first := strings.Fields(b.text); len(first) > 0 && !strings.ContainsAny(first[0], ".:/*{") {
				body = strings.Repeat("\n", b.line-1) + "http://localhost {\n" + b.text + "}\n"
			}
			cfg, warnings, err := adapter.Adapt([]byte(body), map[string]any{"filename": b.file})
			if err != nil {
				t.Fatalf("adapting the snippet: %v\n%s", err, strings.TrimLeft(body, "\n"))
			}
			for _, w := range warnings {
				if !strings.Contains(w.Message, "not formatted") {
					t.Errorf("adapting the snippet: warning %s", w.String())
				}
			}
			if !json.Valid(cfg) || !strings.Contains(string(cfg), `"apps"`) {
				t.Fatalf("the snippet adapted to %s", cfg)
			}
		})
		adapted++
	}
	if adapted < 8 {
		t.Fatalf("only %d caddyfile snippets adapted", adapted)
	}
}

// unsetenv unsets an environment variable for the test and restores it
// after.
func unsetenv(t *testing.T, name string) {
	t.Helper()
	t.Setenv(name, "") // restores the old value at cleanup
	os.Unsetenv(name)
}
