package api

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestDashboardHandler(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		t.Run(method, func(t *testing.T) {
			rec := httptest.NewRecorder()
			serveDashboard(rec, httptest.NewRequest(method, "/", nil))
			res := rec.Result()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", res.StatusCode)
			}
			for k, want := range map[string]string{
				"Content-Type":           "text/html; charset=utf-8",
				"Cache-Control":          "no-store",
				"X-Frame-Options":        "DENY",
				"X-Content-Type-Options": "nosniff",
				"Referrer-Policy":        "no-referrer",
			} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if method == http.MethodHead && rec.Body.Len() != 0 {
				t.Errorf("HEAD answered a body of %d bytes", rec.Body.Len())
			}
			if method == http.MethodGet && rec.Body.String() != string(dashboardHTML) {
				t.Errorf("GET body is not the embedded page")
			}
		})
	}

	t.Run("csp", func(t *testing.T) {
		rec := httptest.NewRecorder()
		serveDashboard(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		csp := rec.Result().Header.Get("Content-Security-Policy")
		directives := map[string]string{}
		for d := range strings.SplitSeq(csp, ";") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
			directives[name] = value
		}
		for name, want := range map[string]string{
			"default-src":     "'none'",
			"connect-src":     "'self'",
			"base-uri":        "'none'",
			"form-action":     "'none'",
			"frame-ancestors": "'none'",
		} {
			if got := directives[name]; got != want {
				t.Errorf("CSP %s: %q, want %q (policy %q)", name, got, want, csp)
			}
		}
		if strings.Contains(csp, "unsafe-") || strings.Contains(csp, "*") {
			t.Errorf("CSP is not strict: %q", csp)
		}
		// Exactly the page's own inline script and style, by hash.
		html := string(dashboardHTML)
		for _, tag := range []string{"script", "style"} {
			blocks := regexp.MustCompile(`(?s)<`+tag+`>(.*?)</`+tag+`>`).FindAllStringSubmatch(html, -1)
			if len(blocks) != 1 {
				t.Fatalf("page has %d <%s> blocks, want 1", len(blocks), tag)
			}
			sum := sha256.Sum256([]byte(blocks[0][1]))
			want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
			if got := directives[tag+"-src"]; got != want {
				t.Errorf("CSP %s-src: %q, want %q", tag, got, want)
			}
		}
	})

	t.Run("page", func(t *testing.T) {
		html := string(dashboardHTML)
		for _, want := range []string{
			`id="token-form"`, `id="token-input"`, `id="message"`, `id="live"`, `data-status="offline"`,
			`id="state-filter"`, `"data-id"`, `"data-state"`, `"data-action"`, `el("td", "state")`,
			`name: "wake"`, `name: "pause"`, `name: "stop"`, `name: "keepalive"`, `name: "destroy"`,
			`"Last-Event-ID"`, `sessionStorage`,
		} {
			if !strings.Contains(html, want) {
				t.Errorf("page lacks %s", want)
			}
		}
		// Offline and under the CSP: nothing loaded from elsewhere, no
		// inline handlers or style attributes (the CSP would block them).
		for _, bad := range []*regexp.Regexp{
			regexp.MustCompile(`(?i)\b(src|href|action)\s*=\s*["']?(https?:)?//`),
			regexp.MustCompile(`(?i)<[a-z][^>]*\sstyle\s*=`),
			regexp.MustCompile(`(?i)<[a-z][^>]*\son[a-z]+\s*=`),
			regexp.MustCompile(`(?i)\binnerHTML\b|\beval\(`),
		} {
			if m := bad.FindString(html); m != "" {
				t.Errorf("page contains %q", m)
			}
		}
	})
}

func TestDashboardInlineHashes(t *testing.T) {
	for _, tc := range []struct {
		page, tag string
		n         int
	}{
		{"<p>no script</p>", "script", 0},
		{"<script>a</script>", "script", 1},
		{"<script>a</script><script>b</script>", "script", 2},
		{"<script>unterminated", "script", 0},
	} {
		got := inlineHashes([]byte(tc.page), tc.tag)
		if tc.n == 0 {
			if len(got) != 1 || got[0] != "'none'" {
				t.Errorf("%q: %v, want ['none']", tc.page, got)
			}
			continue
		}
		if len(got) != tc.n {
			t.Errorf("%q: %d hashes, want %d", tc.page, len(got), tc.n)
		}
	}
}
