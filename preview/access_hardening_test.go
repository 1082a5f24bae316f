package preview_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/preview"
)

// rawPreview sends one HTTP/1.1 request with target written as is in the
// request line (no client-side escaping or cleaning), to the preview
// listener on loopback.
func (h *harness) rawPreview(method, host, target string, header http.Header) (*http.Response, string) {
	h.T.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", h.PreviewPort), 5*time.Second)
	if err != nil {
		h.T.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, host)
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		h.T.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		h.T.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// browserTarget is where a browser goes for a Location header, roughly as
// the WHATWG URL parser reads it for an http(s) page: leading and trailing
// C0 controls and spaces dropped, tabs and newlines removed anywhere,
// backslashes read as slashes. It returns the host it would leave for ("" when
// it stays on the page's host).
func browserTarget(loc string) string {
	loc = strings.TrimFunc(loc, func(r rune) bool { return r <= ' ' })
	loc = strings.NewReplacer("\t", "", "\n", "", "\r", "", `\`, "/").Replace(loc)
	if strings.HasPrefix(loc, "//") {
		rest := strings.TrimLeft(loc, "/")
		host, _, _ := strings.Cut(rest, "/")
		return host
	}
	if u, err := url.Parse(loc); err == nil && u.Scheme != "" {
		return u.Host + "(" + u.Scheme + ")"
	}
	return ""
}

// TestPreviewTokensDoNotSurviveRecreate: a token minted for a sandbox —
// revoked or not — never opens a later sandbox created under the same id,
// after a destroy or a purge, even once the new sandbox's generation has
// caught up with the token's.
func TestPreviewTokensDoNotSurviveRecreate(t *testing.T) {
	h := newHarness(t, "")
	e := currentEngine(t)
	for _, gone := range []string{"destroy", "purge"} {
		t.Run(gone, func(t *testing.T) {
			rec := createPrivate(h)
			id, host := rec.ID, h.Host(rec.ID, 8080)
			revoked := h.mintToken(id, "1h", "revoked").Token // generation 0
			h.revokeTokens(id)
			live := h.mintToken(id, "1h", "live").Token // generation 1
			first, err := e.Mgr.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if resp, body := h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+live)); resp.StatusCode != http.StatusOK {
				t.Fatalf("the live token on the first sandbox: %d %s", resp.StatusCode, body)
			}

			switch gone {
			case "destroy":
				if status := h.API("DELETE", "/v1/sandboxes/"+id, nil, nil); status != http.StatusNoContent {
					t.Fatalf("destroy: %d", status)
				}
			case "purge":
				if status := h.API("POST", "/v1/sandboxes/"+id+"/purge", nil, nil); status != http.StatusOK {
					t.Fatalf("purge: %d", status)
				}
			}
			status, again := h.CreateWith(map[string]any{"id": id, "access": "private"})
			if status != http.StatusCreated || again.State != "running" || again.Access != "private" {
				t.Fatalf("create %s again: %d %+v", id, status, again)
			}
			second, err := e.Mgr.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if second.Incarnation == "" || second.Incarnation == first.Incarnation {
				t.Fatalf("incarnation %q after %q", second.Incarnation, first.Incarnation)
			}

			refused := func(when string, tokens map[string]string) {
				t.Helper()
				for name, tok := range tokens {
					resp, body := h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+tok))
					if resp.StatusCode != http.StatusUnauthorized {
						t.Errorf("%s: the %s token as Bearer: %d %q, want 401", when, name, resp.StatusCode, body)
					}
					resp, body = h.Preview("GET", host, "/", nil, withHeader(gatewaytest.BrowserHeader(), "Cookie", gateway.TokenCookie+"="+tok))
					if resp.StatusCode != http.StatusUnauthorized || pageKind(body) != preview.PageUnauthorized {
						t.Errorf("%s: the %s token as cookie: %d kind %q, want 401", when, name, resp.StatusCode, pageKind(body))
					}
					resp, _ = h.Preview("GET", host, "/?"+gateway.TokenQueryParam+"="+url.QueryEscape(tok), nil, gatewaytest.BrowserHeader())
					if resp.StatusCode != http.StatusUnauthorized || len(resp.Header.Values("Set-Cookie")) != 0 {
						t.Errorf("%s: the %s token in the URL: %d, cookies %q; want 401 and none", when, name, resp.StatusCode, resp.Header.Values("Set-Cookie"))
					}
				}
			}
			old := map[string]string{"revoked": revoked, "live": live}
			refused("after "+gone+" and create", old)
			// The new sandbox reaches the live token's generation.
			h.revokeTokens(id)
			if r, _ := e.Mgr.Get(id); r.TokenGeneration != 1 {
				t.Fatalf("generation %d after one revoke, want 1", r.TokenGeneration)
			}
			refused("at the same generation", old)

			// Tokens of the new sandbox work.
			m := h.mintToken(id, "1h", "new")
			u, _ := url.Parse(m.URL)
			resp, _ := h.Preview("GET", host, u.RequestURI(), nil, gatewaytest.BrowserHeader())
			if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
				t.Fatalf("first visit with a new token: %d cookies %q", resp.StatusCode, resp.Header.Values("Set-Cookie"))
			}
			c := resp.Cookies()[0]
			resp, body := h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Cookie", c.Name+"="+c.Value))
			if resp.StatusCode != http.StatusOK || body != "ok\n" {
				t.Fatalf("the new token as cookie: %d %q", resp.StatusCode, body)
			}
		})
	}
}

// TestAccessChangeRotatesTokens: making a private sandbox public and then
// private again closes it to every token minted before, whether minted while
// it was private or public.
func TestAccessChangeRotatesTokens(t *testing.T) {
	h := newHarness(t, "")
	rec := createPrivate(h)
	host := h.Host(rec.ID, 8080)
	get := func(tok string) int {
		t.Helper()
		hdr := gatewaytest.APIHeader()
		if tok != "" {
			hdr.Set("Authorization", "Bearer "+tok)
		}
		resp, _ := h.Preview("GET", host, "/healthz", nil, hdr)
		return resp.StatusCode
	}
	patch := func(access string) {
		t.Helper()
		var v client.Sandbox
		if status := h.API("PATCH", "/v1/sandboxes/"+rec.ID, map[string]any{"access": access}, &v); status != http.StatusOK || v.Access != access {
			t.Fatalf("PATCH access %s: %d %+v", access, status, v)
		}
	}

	whilePrivate := h.mintToken(rec.ID, "1h", "private").Token
	if s := get(whilePrivate); s != http.StatusOK {
		t.Fatalf("token minted while private: %d", s)
	}
	patch("public")
	if s := get(""); s != http.StatusOK {
		t.Fatalf("public, no token: %d", s)
	}
	whilePublic := h.mintToken(rec.ID, "1h", "public").Token
	patch("private")
	for name, tok := range map[string]string{"minted while private": whilePrivate, "minted while public": whilePublic} {
		if s := get(tok); s != http.StatusUnauthorized {
			t.Errorf("private again, token %s: %d, want 401", name, s)
		}
	}
	fresh := h.mintToken(rec.ID, "1h", "fresh").Token
	if s := get(fresh); s != http.StatusOK {
		t.Fatalf("token minted after the change: %d", s)
	}
	// Setting the access it already has revokes nothing.
	patch("private")
	if s := get(fresh); s != http.StatusOK {
		t.Errorf("PATCH private on a private sandbox revoked its tokens: %d", s)
	}
	patch("public")
	patch("private")
	if s := get(fresh); s != http.StatusUnauthorized {
		t.Errorf("after public and private again, the earlier token: %d, want 401", s)
	}
}

// TestPreviewRedirectsStayOnHost: the redirect after a first visit with a
// token, and the one after the wake form, go to a path on the preview host,
// never to a URL a browser reads as another host.
func TestPreviewRedirectsStayOnHost(t *testing.T) {
	h := newHarness(t, "")
	rec := createPrivate(h)
	host := h.Host(rec.ID, 8080)
	tok := h.mintToken(rec.ID, "1h", "").Token
	q := gateway.TokenQueryParam + "=" + url.QueryEscape(tok)

	visits := []struct{ target, want string }{
		{"//evil.example/x?" + q, "/"},
		{"//evil.example/x?a=1&" + q, "/"},
		{"///evil.example/x?" + q, "/"},
		{`/\evil.example/x?` + q, "/%5Cevil.example/x"},
		{`/\/evil.example/x?` + q, "/%5C/evil.example/x"},
		{"/%2F%2Fevil.example/x?" + q, "/%2F%2Fevil.example/x"},
		{"/%5C%5Cevil.example/x?" + q, "/%5C%5Cevil.example/x"},
		{"/%09/evil.example/x?" + q, "/%09/evil.example/x"},
		{"/files/x?a=1&" + q, "/files/x?a=1"},
	}
	for _, v := range visits {
		resp, body := h.rawPreview("GET", host, v.target, gatewaytest.BrowserHeader())
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("GET %s: %d %q, want 303", v.target, resp.StatusCode, body)
			continue
		}
		if other := browserTarget(loc); other != "" {
			t.Errorf("GET %s: Location %q sends the browser to %s", v.target, loc, other)
		}
		if loc != v.want {
			t.Errorf("GET %s: Location %q, want %q", v.target, loc, v.want)
		}
	}

	// The wake form posts back to the page it came from (its Referer).
	forms := []struct{ referer, want string }{
		{"http://" + host + "//evil.example/x", "/"},
		{"http://" + host + "///evil.example/x", "/"},
		{"http://" + host + `/\evil.example/x`, "/%5Cevil.example/x"},
		{"http://" + host + "/%5Cevil.example/x", "/%5Cevil.example/x"},
		{"http://" + host + "/%2F%2Fevil.example/x", "/%2F%2Fevil.example/x"},
		{"http://" + host + "/%09/evil.example/x", "/%09/evil.example/x"},
		{"http://" + host + "/%0A/evil.example/x", "/%0A/evil.example/x"},
		{"http://evil.example/x", "/"},
		{"http://" + host + "/files/x?a=1", "/files/x?a=1"},
	}
	cookie := gateway.TokenCookie + "=" + tok
	for _, f := range forms {
		hdr := http.Header{
			"Content-Type": {"application/x-www-form-urlencoded"},
			"Cookie":       {cookie},
			"Referer":      {f.referer},
		}
		resp, body := h.rawPreview("POST", host, preview.PathWake, hdr)
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("wake form from %s: %d %q, want 303", f.referer, resp.StatusCode, body)
			continue
		}
		if other := browserTarget(loc); other != "" {
			t.Errorf("wake form from %s: Location %q sends the browser to %s", f.referer, loc, other)
		}
		if loc != f.want {
			t.Errorf("wake form from %s: Location %q, want %q", f.referer, loc, f.want)
		}
	}
}

// TestPrivatePreviewPassesAppCookies: on a private preview the app receives
// its own cookies exactly as the browser sent them; only sandwake's cookie is
// taken out.
func TestPrivatePreviewPassesAppCookies(t *testing.T) {
	h := newHarness(t, "")
	rec := createPrivate(h)
	host := h.Host(rec.ID, 8080)
	tok := h.mintToken(rec.ID, "1h", "").Token
	ours := gateway.TokenCookie + "=" + tok
	tests := []struct {
		name string
		sent []string // Cookie header fields
		want []string // Cookie lines the app sees
	}{
		{"odd but common values", []string{ours + `; d=a"b; e=ü; c=x y`}, []string{`d=a"b; e=ü; c=x y`}},
		{"ours in the middle", []string{`f="quoted"; ` + ours + `; g=1;h=2`}, []string{`f="quoted"; g=1;h=2`}},
		{"ours last", []string{"a=1;  b=2 ; " + ours}, []string{"a=1;  b=2"}},
		{"several fields", []string{"a=1", ours, `b="2"`}, []string{"a=1", `b="2"`}},
		{"only ours", []string{ours}, nil},
	}
	for _, tt := range tests {
		resp, body := h.rawPreview("GET", host, "/headers", http.Header{"Cookie": tt.sent})
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %q", tt.name, resp.StatusCode, body)
			continue
		}
		var got []string
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "Cookie: "); ok {
				got = append(got, v)
			}
		}
		if strings.Join(got, "\n") != strings.Join(tt.want, "\n") || len(got) != len(tt.want) {
			t.Errorf("%s: the app saw Cookie %q, want %q", tt.name, got, tt.want)
		}
		if strings.Contains(body, tok) {
			t.Errorf("%s: the app saw the preview token", tt.name)
		}
	}
}

// TestAuthSchemesCaseInsensitive: "bearer", "BEARER"… work like "Bearer"
// (RFC 7235): a preview token in any case opens a private preview and never
// reaches the app, and the API accepts its token in any case.
func TestAuthSchemesCaseInsensitive(t *testing.T) {
	h := newHarness(t, "")
	rec := createPrivate(h)
	host := h.Host(rec.ID, 8080)
	tok := h.mintToken(rec.ID, "1h", "").Token
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		// The token by header alone.
		resp, body := h.Preview("GET", host, "/headers", nil, withHeader(gatewaytest.APIHeader(), "Authorization", scheme+" "+tok))
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s <token>: %d %q", scheme, resp.StatusCode, body)
		}
		if strings.Contains(body, tok) || strings.Contains(body, "Authorization:") {
			t.Errorf("%s <token>: the app saw the token: %q", scheme, body)
		}
		// With the cookie too: the header is still taken out.
		resp, body = h.Preview("GET", host, "/headers", nil, withHeader(gatewaytest.APIHeader(), "Authorization", scheme+" "+tok, "Cookie", gateway.TokenCookie+"="+tok))
		if resp.StatusCode != http.StatusOK || strings.Contains(body, tok) {
			t.Errorf("%s <token> with the cookie: %d, the app saw the token: %v", scheme, resp.StatusCode, strings.Contains(body, tok))
		}
	}
	// The app's own credentials pass.
	resp, body := h.Preview("GET", host, "/headers", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "bearer app-secret", "Cookie", gateway.TokenCookie+"="+tok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Authorization: bearer app-secret\n") {
		t.Errorf("the app's own bearer token: %d %q", resp.StatusCode, body)
	}

	for _, c := range []struct {
		auth string
		want int
	}{
		{"Bearer " + gatewaytest.Token, http.StatusOK},
		{"bearer " + gatewaytest.Token, http.StatusOK},
		{"BEARER " + gatewaytest.Token, http.StatusOK},
		{"bearer  " + gatewaytest.Token, http.StatusOK},
		{"bearer wrong", http.StatusUnauthorized},
		{"Basic " + gatewaytest.Token, http.StatusUnauthorized},
		{gatewaytest.Token, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("GET", h.APIURL("/v1/sandboxes/"+rec.ID), nil)
		req.Header.Set("Authorization", c.auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("API with Authorization %q: %d, want %d", strings.Replace(c.auth, gatewaytest.Token, "<token>", 1), resp.StatusCode, c.want)
		}
	}
}
