package preview_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/preview"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// createPrivate makes a running private sandbox.
func createPrivate(h *harness) swclient.Sandbox {
	h.T.Helper()
	status, rec := h.CreateWith(map[string]any{"access": "private"})
	if status != http.StatusCreated || rec.State != "running" || rec.Access != "private" {
		h.T.Fatalf("create private: %d %+v", status, rec)
	}
	return rec
}

// mintedToken is the answer of POST /v1/sandboxes/{id}/tokens.
type mintedToken struct {
	Token     string    `json:"token"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (h *harness) mintToken(id, ttl, subject string) mintedToken {
	h.T.Helper()
	var m mintedToken
	if status := h.API("POST", "/v1/sandboxes/"+id+"/tokens", map[string]any{"ttl": ttl, "subject": subject}, &m); status != http.StatusCreated || !strings.HasPrefix(m.Token, gateway.TokenPrefix) {
		h.T.Fatalf("minting a token for %s: %d %+v", id, status, m)
	}
	return m
}

func (h *harness) revokeTokens(id string) {
	h.T.Helper()
	if status := h.API("DELETE", "/v1/sandboxes/"+id+"/tokens", nil, nil); status != http.StatusNoContent {
		h.T.Fatalf("revoking the tokens of %s: %d", id, status)
	}
}

// previewResult is a preview answer read in full; safe to produce off the
// test goroutine.
type previewResult struct {
	status int
	header http.Header
	body   string
	err    error
}

// fetch sends a preview request without failing the test, for use from
// worker goroutines.
func (h *harness) fetch(method, host, path string, header http.Header) previewResult {
	req, err := http.NewRequest(method, "http://"+host+path, nil)
	if err != nil {
		return previewResult{err: err}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := h.Client.Do(req)
	if err != nil {
		return previewResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return previewResult{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// withHeader returns a copy of base with k: v added.
func withHeader(base http.Header, kv ...string) http.Header {
	h := base.Clone()
	if h == nil {
		h = http.Header{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// jsonErrorCode reads the code of sandwake's {"error":{"code":…}} body.
func jsonErrorCode(body string) (code, message string) {
	var e swclient.ErrorResponse
	if json.Unmarshal([]byte(body), &e) != nil {
		return "", ""
	}
	return e.Error.Code, e.Error.Message
}

func pageKind(body string) string {
	_, rest, ok := strings.Cut(body, `<body data-kind="`)
	if !ok {
		return ""
	}
	kind, _, _ := strings.Cut(rest, `"`)
	return kind
}

// currentEngine is the engine of the harness's Caddy (one at a time, see
// caddyMu).
func currentEngine(t *testing.T) *gateway.Gateway {
	t.Helper()
	e := gateway.Current()
	if e == nil {
		t.Fatal("no sandwake engine running")
	}
	return e
}

// TestPrivatePreview: a private sandbox answers only with a valid preview
// token, and nothing without one wakes it.
func TestPrivatePreview(t *testing.T) {
	h := newHarness(t, "")
	a := createPrivate(h)
	b := createPrivate(h)
	h.Stop(a.ID)
	h.Stop(b.ID)
	host := h.Host(a.ID, 8080)
	e := currentEngine(t)
	secret := e.Current.Load().PreviewSecret

	// A token revoked before use, then tokens at the current generation.
	revoked := h.mintToken(a.ID, "1h", "revoked").Token
	h.revokeTokens(a.ID)
	rec, err := e.Mgr.Get(a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TokenGeneration == 0 {
		t.Fatalf("token generation still 0 after DELETE …/tokens")
	}
	future := time.Now().Add(time.Hour)
	cases := []struct {
		name, token, why string
	}{
		{"no token", "", "required"},
		// "abc" and "def" decode as base64url: a well-formed token with a
		// wrong MAC.
		{"garbage", "swt_abc.def", "not valid"},
		{"malformed", "swt_not base64!.x", "malformed"},
		{"wrong secret", gateway.SignToken([]byte("not-the-preview-secret-at-all"), a.ID, rec.Incarnation, rec.TokenGeneration, future, ""), "not valid"},
		{"expired", gateway.SignToken(secret, a.ID, rec.Incarnation, rec.TokenGeneration, time.Now().Add(-time.Minute), ""), "expired"},
		{"other sandbox", h.mintToken(b.ID, "1h", "").Token, "another sandbox"},
		{"revoked", revoked, "revoked"},
	}
	since := time.Now()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A browser page load with the token as cookie.
			hdr := gatewaytest.BrowserHeader()
			if c.token != "" {
				hdr.Set("Cookie", gateway.TokenCookie+"="+c.token)
			}
			resp, body := h.Preview("GET", host, "/", nil, hdr)
			if resp.StatusCode != http.StatusUnauthorized || pageKind(body) != preview.PageUnauthorized {
				t.Errorf("page load with cookie: %d kind %q, want 401 %q", resp.StatusCode, pageKind(body), preview.PageUnauthorized)
			}
			if !strings.Contains(body, c.why) {
				t.Errorf("page load: the page does not say the token is %q", c.why)
			}
			if resp.Header.Get("X-Robots-Tag") != "noindex" {
				t.Errorf("page load: X-Robots-Tag %q", resp.Header.Get("X-Robots-Tag"))
			}

			// An API request with the token as Bearer.
			hdr = gatewaytest.APIHeader()
			if c.token != "" {
				hdr.Set("Authorization", "Bearer "+c.token)
			}
			for _, m := range []struct{ method, path string }{{"GET", "/healthz"}, {"POST", "/echo"}, {"POST", preview.PathWake}, {"GET", preview.PathStatus}} {
				resp, body = h.Preview(m.method, host, m.path, strings.NewReader("x"), hdr)
				code, msg := jsonErrorCode(body)
				if resp.StatusCode != http.StatusUnauthorized || code != "unauthorized" || !strings.Contains(msg, c.why) {
					t.Errorf("%s %s with Bearer: %d %s", m.method, m.path, resp.StatusCode, body)
				}
				if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("%s %s: WWW-Authenticate %q", m.method, m.path, resp.Header.Get("WWW-Authenticate"))
				}
				if c.token != "" && strings.Contains(body, c.token) {
					t.Errorf("%s %s: the answer echoes the token", m.method, m.path)
				}
			}

			// The token in the URL: refused, and no cookie is set.
			if c.token != "" {
				resp, body = h.Preview("GET", host, "/?"+gateway.TokenQueryParam+"="+url.QueryEscape(c.token), nil, gatewaytest.BrowserHeader())
				if resp.StatusCode != http.StatusUnauthorized || pageKind(body) != preview.PageUnauthorized {
					t.Errorf("page load with ?%s: %d kind %q", gateway.TokenQueryParam, resp.StatusCode, pageKind(body))
				}
				if sc := resp.Header.Values("Set-Cookie"); len(sc) > 0 {
					t.Errorf("a refused token set cookies: %q", sc)
				}
				if strings.Contains(body, c.token) {
					t.Errorf("the 401 page echoes the token")
				}
			}

			// A websocket upgrade is refused before any wake.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			wsHdr := http.Header{}
			if c.token != "" {
				wsHdr.Set("Cookie", gateway.TokenCookie+"="+c.token)
			}
			conn, wsResp, err := websocket.Dial(ctx, "ws://"+host+"/ws", &websocket.DialOptions{HTTPClient: h.Client, HTTPHeader: wsHdr})
			if err == nil {
				conn.CloseNow()
				t.Errorf("websocket upgrade succeeded")
			} else if wsResp == nil || wsResp.StatusCode != http.StatusUnauthorized {
				t.Errorf("websocket upgrade: %v (%+v)", err, wsResp)
			}
		})
	}
	if n := h.StartEvents(a.ID, since); n != 0 {
		t.Fatalf("unauthorised requests caused %d docker starts, want 0", n)
	}
	if s := h.State(a.ID); s != "stopped" {
		t.Fatalf("after unauthorised requests the sandbox is %s, want stopped", s)
	}

	// A valid token, given once in the URL, becomes a host-only cookie.
	before := time.Now()
	m := h.mintToken(a.ID, "10m", "alice")
	if want := a.URLs["8080"] + "?" + gateway.TokenQueryParam + "=" + url.QueryEscape(m.Token); m.URL != want {
		t.Errorf("token url %q, want %q", m.URL, want)
	}
	if m.ExpiresAt.Before(before.Add(10*time.Minute-time.Second)) || m.ExpiresAt.After(time.Now().Add(10*time.Minute)) {
		t.Errorf("expires_at %s is not 10m from now", m.ExpiresAt)
	}
	u, err := url.Parse(m.URL)
	if err != nil {
		t.Fatal(err)
	}
	redirects := []struct{ path, want string }{
		{u.RequestURI(), "/"},
		{"/files/x?a=1&" + gateway.TokenQueryParam + "=" + url.QueryEscape(m.Token) + "&b=2", "/files/x?a=1&b=2"},
	}
	var cookie *http.Cookie
	for _, rd := range redirects {
		resp, _ := h.Preview("GET", host, rd.path, nil, gatewaytest.BrowserHeader())
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("GET %s: %d, want 303", rd.path, resp.StatusCode)
		}
		loc := resp.Header.Get("Location")
		if loc != rd.want || strings.Contains(loc, gateway.TokenQueryParam) || strings.Contains(loc, m.Token) {
			t.Errorf("GET %s: Location %q, want %q", rd.path, loc, rd.want)
		}
		if rp := resp.Header.Get("Referrer-Policy"); rp != "no-referrer" {
			t.Errorf("redirect Referrer-Policy %q, want no-referrer", rp)
		}
		raw := resp.Header.Values("Set-Cookie")
		if len(raw) != 1 {
			t.Fatalf("redirect Set-Cookie %q, want one cookie", raw)
		}
		if strings.Contains(strings.ToLower(raw[0]), "domain=") {
			t.Errorf("cookie %q has a Domain attribute: it must be host-only", raw[0])
		}
		c := resp.Cookies()[0]
		if c.Name != gateway.TokenCookie || c.Value != m.Token || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Domain != "" {
			t.Errorf("cookie %q: want %s=<token>; Path=/; HttpOnly; SameSite=Lax, no Domain", raw[0], gateway.TokenCookie)
		}
		if c.Secure {
			t.Errorf("cookie %q is Secure on plain http: the browser would drop it", raw[0])
		}
		if !c.Expires.Equal(m.ExpiresAt) {
			t.Errorf("cookie expires %s, token expires %s", c.Expires, m.ExpiresAt)
		}
		cookie = c
	}
	if n := h.StartEvents(a.ID, since); n != 0 {
		t.Fatalf("the token redirect caused %d docker starts, want 0", n)
	}

	// The cookie alone opens the sandbox: held through the wake.
	cookieHdr := withHeader(gatewaytest.APIHeader(), "Cookie", cookie.Name+"="+cookie.Value)
	resp, body := h.Preview("GET", host, "/healthz", nil, cookieHdr)
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz with the cookie: %d %q", resp.StatusCode, body)
	}
	if n := h.StartEvents(a.ID, since); n != 1 {
		t.Fatalf("%d docker starts after the first authorised request, want 1", n)
	}
	if s := h.State(a.ID); s != "running" {
		t.Fatalf("state %s after the authorised request", s)
	}
	// Other cookies reach the app; the request goes through with them.
	resp, body = h.Preview("POST", host, "/echo", strings.NewReader("payload"), withHeader(gatewaytest.APIHeader(), "Cookie", "app=1; "+cookie.Name+"="+cookie.Value+"; other=2"))
	if resp.StatusCode != http.StatusOK || body != "POST\npayload" {
		t.Errorf("POST /echo with the cookie among others: %d %q", resp.StatusCode, body)
	}
	resp, body = h.Preview("GET", host, "/", nil, withHeader(gatewaytest.BrowserHeader(), "Cookie", cookie.Name+"="+cookie.Value))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="app"`) {
		t.Errorf("page load with the cookie: %d kind %q", resp.StatusCode, pageKind(body))
	}
	// The Bearer form works too.
	resp, body = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+m.Token))
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("GET /healthz with Bearer: %d %q", resp.StatusCode, body)
	}
	// And a websocket with the cookie.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, wsResp, err := websocket.Dial(ctx, "ws://"+host+"/ws", &websocket.DialOptions{
		HTTPClient: h.Client, HTTPHeader: http.Header{"Cookie": {cookie.Name + "=" + cookie.Value}},
	})
	if err != nil {
		t.Fatalf("websocket with the cookie: %v (%+v)", err, wsResp)
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte("private hello")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := conn.Read(ctx); err != nil || string(got) != "private hello" {
		t.Fatalf("websocket echo: %q %v", got, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	// The token of a private sandbox does not open its other sandbox.
	resp, _ = h.Preview("GET", h.Host(b.ID, 8080), "/healthz", nil, cookieHdr)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a's cookie on b: %d, want 401", resp.StatusCode)
	}
	if n := h.StartEvents(b.ID, since); n != 0 {
		t.Errorf("b was started %d times by requests with a's token", n)
	}
	// (That the app never sees the token, and gets its own cookies byte for
	// byte, is checked through the testapp's /headers in
	// access_hardening_test.go.)

	// Revoking closes the running sandbox to the cookie at once.
	h.revokeTokens(a.ID)
	resp, body = h.Preview("GET", host, "/healthz", nil, cookieHdr)
	if code, _ := jsonErrorCode(body); resp.StatusCode != http.StatusUnauthorized || code != "unauthorized" {
		t.Errorf("cookie after revoke: %d %s", resp.StatusCode, body)
	}
	// Making it public opens it without a token; private again closes it.
	for _, step := range []struct {
		access string
		want   int
	}{{"public", http.StatusOK}, {"private", http.StatusUnauthorized}} {
		var v swclient.Sandbox
		if status := h.API("PATCH", "/v1/sandboxes/"+a.ID, map[string]any{"access": step.access}, &v); status != http.StatusOK || v.Access != step.access {
			t.Fatalf("PATCH access %s: %d %+v", step.access, status, v)
		}
		resp, _ = h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader())
		if resp.StatusCode != step.want {
			t.Errorf("after PATCH access %s: GET /healthz without a token: %d, want %d", step.access, resp.StatusCode, step.want)
		}
	}
}

// TestCrawlersAndRobotsNeverWake: crawlers and /robots.txt are answered
// without waking a sleeping sandbox.
func TestCrawlersAndRobotsNeverWake(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	h.Stop(rec.ID)
	host := h.Host(rec.ID, 8080)
	since := time.Now()

	const (
		googlebot = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
		n         = 1000
		workers   = 16
	)
	type job struct {
		kind   string // crawler-page, crawler-api, other-crawler, robots
		ua     string
		header http.Header
		path   string
		method string
	}
	var jobs []job
	for i := range n {
		if i%2 == 0 {
			jobs = append(jobs, job{kind: "crawler-page", ua: googlebot, header: gatewaytest.BrowserHeader(), path: "/", method: "GET"})
		} else {
			jobs = append(jobs, job{kind: "crawler-api", ua: googlebot, header: gatewaytest.APIHeader(), path: fmt.Sprintf("/healthz?i=%d", i), method: "GET"})
		}
	}
	for _, ua := range []string{
		"facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
		"Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)",
		"Pingdom.com_bot_version_1.4_(http://www.pingdom.com/)",
		"Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
		"kube-probe/1.30",
	} {
		for range 10 {
			jobs = append(jobs, job{kind: "other-crawler", ua: ua, header: gatewaytest.BrowserHeader(), path: "/", method: "GET"})
		}
	}
	robotUAs := []string{googlebot, "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0", "curl/8.5.0", ""}
	for i := range n {
		hdr := gatewaytest.BrowserHeader()
		if i%3 == 0 {
			hdr = gatewaytest.APIHeader()
		}
		method := "GET"
		if i%10 == 9 {
			method = "HEAD"
		}
		jobs = append(jobs, job{kind: "robots", ua: robotUAs[i%len(robotUAs)], header: hdr, path: "/robots.txt", method: method})
	}

	var (
		mu           sync.Mutex
		failures     []string
		counts       = map[string]int{}
		noRetryAfter int
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	ch := make(chan job)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range ch {
				hdr := j.header.Clone()
				hdr.Set("User-Agent", j.ua) // an empty value sends no User-Agent
				r := h.fetch(j.method, host, j.path, hdr)
				if r.err != nil {
					fail("%s %s (%s): %v", j.method, j.path, j.kind, r.err)
					continue
				}
				if xrt := r.header.Get("X-Robots-Tag"); xrt != "noindex" {
					fail("%s %s (%s): X-Robots-Tag %q", j.method, j.path, j.kind, xrt)
				}
				switch j.kind {
				case "robots":
					want := "User-agent: *\nDisallow: /\n"
					if j.method == "HEAD" {
						want = ""
					}
					if r.status != http.StatusOK || r.body != want {
						fail("%s /robots.txt (UA %q): %d %q", j.method, j.ua, r.status, r.body)
					}
				default:
					if r.status != http.StatusServiceUnavailable || pageKind(r.body) != preview.PageAsleep {
						fail("%s %s (%s, UA %q): %d kind %q", j.method, j.path, j.kind, j.ua, r.status, pageKind(r.body))
					}
					if r.header.Get("Retry-After") == "" {
						mu.Lock()
						noRetryAfter++
						mu.Unlock()
					}
				}
				mu.Lock()
				counts[j.kind]++
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("answered: %v", counts)
	if noRetryAfter > 0 {
		// gate.go refuseWake sets Retry-After: 3600 for crawlers, but
		// renderPage deletes Retry-After when the page's RetryAfter is 0.
		t.Errorf("%d crawler answers (503) without Retry-After", noRetryAfter)
	}
	if n := h.StartEvents(rec.ID, since); n != 0 {
		t.Fatalf("crawlers and robots.txt caused %d docker starts, want 0", n)
	}
	if s := h.State(rec.ID); s != "stopped" {
		t.Fatalf("after crawlers the sandbox is %s, want stopped", s)
	}

	// A person still wakes it: the guard is not blocking everything.
	resp, body := h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"))
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz by a person: %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Robots-Tag") != "noindex" {
		t.Errorf("proxied answer: X-Robots-Tag %q, want noindex", resp.Header.Get("X-Robots-Tag"))
	}
	if n := h.StartEvents(rec.ID, since); n != 1 {
		t.Fatalf("%d docker starts after the person's request, want 1", n)
	}
	// A crawler on a running sandbox sees the app (it is not woken, it is
	// already awake).
	resp, body = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "User-Agent", googlebot))
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("crawler on a running sandbox: %d %q", resp.StatusCode, body)
	}
}

// TestFailingWakesBackOff: a sandbox whose app cannot start is not restarted
// at the pace of its requests, and an API wake tries again at once.
func TestFailingWakesBackOff(t *testing.T) {
	h := newHarness(t, "wake_timeout 20s")
	// The testapp exits at once when it cannot listen: create fails and
	// leaves the record in error.
	status, rec := h.CreateWith(map[string]any{"env": map[string]string{"PORT": "notaport"}})
	if status == http.StatusCreated {
		t.Fatalf("create of a failing app answered 201: %+v", rec)
	}
	id := rec.ID
	if s := h.State(id); s != "error" {
		t.Fatalf("after the failed create the sandbox is %s, want error", s)
	}
	host := h.Host(id, 8080)
	e := currentEngine(t)
	failures := func() int { return e.Guard.Failures(id) }
	waking := func() bool {
		_, ok := e.Mgr.Waking(id)
		return ok
	}

	since := time.Now()
	const requests = 100
	tick := time.NewTicker(100 * time.Millisecond) // pacing, not an assertion
	defer tick.Stop()
	var (
		accepted, backoffs, pages, apis int
		bad                             []string
	)
	for i := range requests {
		<-tick.C
		switch i % 4 {
		case 0: // a browser page load
			resp, body := h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
			k := pageKind(body)
			if resp.StatusCode != http.StatusServiceUnavailable || (k != preview.PageError && k != preview.PageWarming) {
				bad = append(bad, fmt.Sprintf("#%d page load: %d kind %q", i, resp.StatusCode, k))
			}
			pages++
		case 2: // an API request: told the sandbox failed, or held through a wake in flight that fails again
			resp, body := h.Preview("POST", host, "/echo", strings.NewReader("x"), gatewaytest.APIHeader())
			code, _ := jsonErrorCode(body)
			told := resp.StatusCode == http.StatusServiceUnavailable && code == "sandbox_error"
			held := (resp.StatusCode == http.StatusBadGateway && (code == "not_ready" || code == "failed")) ||
				(resp.StatusCode == http.StatusServiceUnavailable && (code == "waking" || code == "timeout"))
			if !told && !held {
				bad = append(bad, fmt.Sprintf("#%d API request: %d %s", i, resp.StatusCode, body))
			}
			apis++
		default: // the page's Wake button, as a script would press it
			resp, body := h.Preview("POST", host, preview.PathWake, nil, gatewaytest.APIHeader())
			code, _ := jsonErrorCode(body)
			switch {
			case resp.StatusCode == http.StatusAccepted:
				accepted++
			case resp.StatusCode == http.StatusServiceUnavailable && code == "backoff":
				backoffs++
				if resp.Header.Get("Retry-After") == "" {
					bad = append(bad, fmt.Sprintf("#%d backoff answer without Retry-After", i))
				}
			default:
				bad = append(bad, fmt.Sprintf("#%d wake POST: %d %s", i, resp.StatusCode, body))
			}
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return !waking(), "a wake is still in flight"
	})
	starts := h.StartEvents(id, since)
	t.Logf("%d requests (%d page loads, %d API, %d wake POSTs: %d accepted, %d backoff) → %d docker starts, %d recorded failures",
		requests, pages, apis, accepted+backoffs, accepted, backoffs, starts, failures())
	if starts < 1 || starts > 5 {
		t.Errorf("%d docker starts for %d wake POSTs over the loop, want 1..5 (backoff 2s, 4s, 8s…)", starts, accepted+backoffs)
	}
	if backoffs == 0 {
		t.Errorf("no wake POST was answered with backoff")
	}
	if f := failures(); f != starts {
		t.Errorf("%d failed wakes recorded for %d starts", f, starts)
	}
	if s := h.State(id); s != "error" {
		t.Errorf("after failing wakes the sandbox is %s, want error", s)
	}

	// An explicit API wake ignores and resets the backoff: one attempt, at
	// once, and the failure count starts again from one.
	var woke json.RawMessage
	status = h.API("POST", "/v1/sandboxes/"+id+"/wake", nil, &woke)
	// not_ready when the exit is seen while probing; failed when the
	// container is gone before its ports could be read.
	if code, _ := jsonErrorCode(string(woke)); status != http.StatusBadGateway || (code != "not_ready" && code != "failed") {
		t.Fatalf("API wake of a failing app: %d %s, want 502", status, woke)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n := h.StartEvents(id, since)
		return n >= starts+1, fmt.Sprintf("%d docker starts, want %d", n, starts+1)
	})
	if n := h.StartEvents(id, since); n != starts+1 {
		t.Errorf("%d docker starts after the API wake, want %d", n, starts+1)
	}
	if f := failures(); f != 1 {
		t.Errorf("%d failures recorded after the API wake, want 1 (reset, then one failure)", f)
	}
}

// TestNoSecretsInLogsOrEvents: preview tokens and the preview secret appear
// in no log line, event or API answer (but the one that mints a token).
func TestNoSecretsInLogsOrEvents(t *testing.T) {
	logDir := t.TempDir()
	mainLog := filepath.Join(logDir, "caddy.log")
	previewLog := filepath.Join(logDir, "preview-access.log")
	apiLog := filepath.Join(logDir, "api-access.log")
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	storage file_system %s
	log {
		output file %s
		level DEBUG
	}
	sandwake {
		storage %s
		preview_url http://*.preview.localhost:%d
		label %s %s
		stop_timeout 5s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	log {
		output file %s
	}
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	log {
		output file %s
	}
	sandwake_api {
		token %s
	}
}
`, filepath.Join(h.Dir, "caddy"), mainLog, filepath.Join(h.Dir, "sandwake"), h.PreviewPort,
			testenv.LabelRun, testenv.RunID(), h.PreviewPort, previewLog, h.APIPort, apiLog, gatewaytest.Token)
	})
	e := currentEngine(t)
	secret := e.Current.Load().PreviewSecret
	if len(secret) < 16 {
		t.Fatalf("preview secret of %d bytes", len(secret))
	}

	rec := createPrivate(h)
	h.Stop(rec.ID)
	host := h.Host(rec.ID, 8080)
	var tokens []string

	// First visit by link: redirect, cookie.
	m := h.mintToken(rec.ID, "10m", "bob@example.com")
	tokens = append(tokens, m.Token)
	u, _ := url.Parse(m.URL)
	resp, _ := h.Preview("GET", host, u.RequestURI(), nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("first visit: %d cookies %q", resp.StatusCode, resp.Header.Values("Set-Cookie"))
	}
	cookie := resp.Cookies()[0]
	// The page load with the cookie starts the wake (warming page), the
	// API request is held through it.
	resp, body := h.Preview("GET", host, "/", nil, withHeader(gatewaytest.BrowserHeader(), "Cookie", cookie.Name+"="+cookie.Value))
	if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusOK {
		t.Errorf("page load with the cookie: %d kind %q", resp.StatusCode, pageKind(body))
	}
	resp, body = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Cookie", cookie.Name+"="+cookie.Value))
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz with the cookie: %d %q", resp.StatusCode, body)
	}
	resp, body = h.Preview("POST", host, "/echo", strings.NewReader("hi"), withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+m.Token))
	if resp.StatusCode != http.StatusOK || body != "POST\nhi" {
		t.Fatalf("POST /echo with Bearer: %d %q", resp.StatusCode, body)
	}
	resp, _ = h.Preview("GET", host, preview.PathStatus, nil, withHeader(gatewaytest.APIHeader(), "Cookie", cookie.Name+"="+cookie.Value))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status with the cookie: %d", resp.StatusCode)
	}
	// Refused tokens: expired, revoked, by query.
	recNow, err := e.Mgr.Get(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	expired := gateway.SignToken(secret, rec.ID, recNow.Incarnation, recNow.TokenGeneration, time.Now().Add(-time.Minute), "eve")
	tokens = append(tokens, expired)
	resp, _ = h.Preview("GET", host, "/?"+gateway.TokenQueryParam+"="+url.QueryEscape(expired), nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("expired token by query: %d", resp.StatusCode)
	}
	h.revokeTokens(rec.ID)
	resp, _ = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Cookie", cookie.Name+"="+cookie.Value))
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("cookie after revoke: %d", resp.StatusCode)
	}
	resp, _ = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+m.Token))
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("Bearer after revoke: %d", resp.StatusCode)
	}
	// A second, used token after the revoke, then the sandbox sleeps.
	m2 := h.mintToken(rec.ID, "1h", "")
	tokens = append(tokens, m2.Token)
	resp, _ = h.Preview("GET", host, "/healthz", nil, withHeader(gatewaytest.APIHeader(), "Authorization", "Bearer "+m2.Token))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("new token after revoke: %d", resp.StatusCode)
	}
	h.Stop(rec.ID)

	// Everything sandwake tells: API answers and the event log.
	var told strings.Builder
	apiGet := func(path string) {
		req, _ := http.NewRequest("GET", h.APIURL(path), nil)
		req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		fmt.Fprintf(&told, "GET %s\n%s\n", path, b)
	}
	apiGet("/v1/sandboxes")
	apiGet("/v1/sandboxes/" + rec.ID)
	apiGet("/v1/sandboxes/" + rec.ID + "/history")
	evs, err := e.Mgr.EventsAfter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 {
		t.Fatal("the event log is empty")
	}
	evJSON, _ := json.Marshal(evs)
	fmt.Fprintf(&told, "events\n%s\n", evJSON)

	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("reading %s: %v", p, err)
		}
		return string(b)
	}
	logText := read(mainLog)
	if !strings.Contains(logText, "sandwake engine started") {
		t.Fatalf("the captured log has no sandwake lines (%d bytes): the capture is not working", len(logText))
	}
	apiAccess := read(apiLog)
	previewAccess := read(previewLog)
	if !strings.Contains(previewAccess, rec.ID) || !strings.Contains(apiAccess, "/tokens") {
		t.Fatalf("the access logs did not capture the run (preview %d bytes, api %d bytes)", len(previewAccess), len(apiAccess))
	}

	secrets := map[string]string{
		"secret (raw)":           string(secret),
		"secret (hex)":           hex.EncodeToString(secret),
		"secret (base64)":        base64.StdEncoding.EncodeToString(secret),
		"secret (base64 raw)":    base64.RawStdEncoding.EncodeToString(secret),
		"secret (base64url)":     base64.URLEncoding.EncodeToString(secret),
		"secret (base64url raw)": base64.RawURLEncoding.EncodeToString(secret),
	}
	for i, tok := range tokens {
		secrets[fmt.Sprintf("token %d", i)] = tok
		secrets[fmt.Sprintf("token %d (MAC)", i)] = tok[strings.LastIndex(tok, ".")+1:]
		secrets[fmt.Sprintf("token %d (query-escaped)", i)] = url.QueryEscape(tok)
	}
	for where, text := range map[string]string{
		"API answers and events": told.String(),
		"caddy log":              logText,
		"API access log":         apiAccess,
	} {
		for what, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s contain %s", where, what)
			}
		}
	}

	// The preview access log: Caddy logs each request's URI as received
	// (cloned before any handler runs), so a first visit's
	// ?sandwake_token= is there unless the operator filters it; headers
	// (Cookie, Authorization, Set-Cookie) must be redacted, and no other
	// line may carry a token.
	for ln, line := range strings.Split(strings.TrimSpace(previewAccess), "\n") {
		var entry struct {
			Request struct {
				URI string `json:"uri"`
			} `json:"request"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("preview access log line %d is not JSON: %v", ln+1, err)
			continue
		}
		for what, s := range secrets {
			if !strings.Contains(line, s) {
				continue
			}
			if strings.HasPrefix(what, "secret") {
				t.Errorf("preview access log line %d contains the %s", ln+1, what)
				continue
			}
			// Only the URI of a first visit may carry it.
			rest := strings.Replace(line, entry.Request.URI, "", 1)
			if !strings.Contains(entry.Request.URI, gateway.TokenQueryParam+"=") || strings.Contains(rest, s) {
				t.Errorf("preview access log line %d contains %s outside a first visit's URI: %s", ln+1, what, line)
			}
		}
	}
	if strings.Contains(previewAccess, gateway.TokenQueryParam+"=") {
		t.Logf("note: the preview access log holds first-visit URIs with %s= (Caddy logs URIs as received); operators should filter it: format filter { request>uri query { delete %s } }", gateway.TokenQueryParam, gateway.TokenQueryParam)
	}
}
