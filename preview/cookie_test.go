package preview_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// TestTokenCookieFollowsTheVisitorsScheme: behind a proxy Caddy trusts
// (trusted_proxies) that says X-Forwarded-Proto: https, the preview-token
// cookie is Secure and named __Host-sandwake_token, and that cookie alone
// opens the sandbox without reaching the app; the same header from a
// client Caddy does not trust changes nothing (a plain, non-Secure cookie).
func TestTokenCookieFollowsTheVisitorsScheme(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted bool
		secure  bool
	}{
		{"trusted proxy says https", true, true},
		{"untrusted client says https", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWithCaddyfile(t, func(h *harness) string {
				cf := h.Caddyfile("")
				if tc.trusted {
					cf = strings.Replace(cf, "\tauto_https off\n", "\tauto_https off\n\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}\n", 1)
				}
				return cf
			})
			a := createPrivate(h)
			m := h.mintToken(a.ID, "10m", "alice")
			u, err := url.Parse(m.URL)
			if err != nil {
				t.Fatal(err)
			}
			host := h.Host(a.ID, 8080)
			resp, _ := h.Preview("GET", host, u.RequestURI(), nil, withHeader(gatewaytest.BrowserHeader(), "X-Forwarded-Proto", "https"))
			if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
				t.Fatalf("first visit: %d, cookies %q", resp.StatusCode, resp.Header.Values("Set-Cookie"))
			}
			c := resp.Cookies()[0]
			wantName := gateway.TokenCookie
			if tc.secure {
				wantName = gateway.TokenCookieHost
			}
			if c.Name != wantName || c.Secure != tc.secure || c.Path != "/" || c.Domain != "" || !c.HttpOnly || c.Value != m.Token {
				t.Fatalf("cookie %q, want %s with Secure=%v, Path=/, no Domain, HttpOnly", resp.Header.Values("Set-Cookie"), wantName, tc.secure)
			}
			// The cookie alone opens the sandbox; the app sees neither
			// name.
			hdr := withHeader(gatewaytest.APIHeader(), "Cookie", c.Name+"="+c.Value+"; theme=dark")
			resp, body := h.Preview("GET", host, "/headers", nil, hdr)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("with the cookie: %d %q", resp.StatusCode, body)
			}
			if strings.Contains(body, "sandwake_token") || strings.Contains(body, m.Token) || !strings.Contains(body, "theme=dark") {
				t.Fatalf("the app saw: %q, want the other cookie only", body)
			}
		})
	}
}
