package preview

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	hostileError = `<script>alert(1)</script>`
	hostileID    = `"><img src=x onerror=alert(1)></script><script>alert(2)</script>`
)

// withPageNow fixes the page clock for one test.
func withPageNow(t *testing.T, now time.Time) {
	t.Helper()
	old := pageNow
	pageNow = func() time.Time { return now }
	t.Cleanup(func() { pageNow = old })
}

func renderPageForTest(t *testing.T, method string, status int, d pageData) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, "http://s-abc-3000.preview.localhost/", nil)
	w := httptest.NewRecorder()
	renderPage(w, r, status, d)
	return w
}

// elementTag returns the opening tag of the element with the given id, or "".
func elementTag(body, id string) string {
	re := regexp.MustCompile(`<[a-z]+[^>]*\sid="` + regexp.QuoteMeta(id) + `"[^>]*>`)
	return re.FindString(body)
}

func TestPageKinds(t *testing.T) {
	now := time.Date(2026, 11, 23, 5, 0, 10, 0, time.UTC)
	withPageNow(t, now)
	since := now.Add(-1400 * time.Millisecond)

	tests := []struct {
		name   string
		status int
		d      pageData
		live   bool
	}{
		{"warming", http.StatusServiceUnavailable, pageData{Kind: pageWarming, SandboxID: hostileID, Port: 3000, State: "stopped", Since: since, RetryAfter: 2}, true},
		{"creating without retry-after", http.StatusServiceUnavailable, pageData{Kind: pageCreating, SandboxID: "abc", Port: 3000, State: "creating"}, true},
		{"capacity with wake", http.StatusServiceUnavailable, pageData{Kind: pageCapacity, SandboxID: "abc", Port: 3000, State: "stopped", RetryAfter: 5, CanWake: true}, true},
		{"unavailable without sandbox", http.StatusServiceUnavailable, pageData{Kind: pageUnavailable, Message: "docker <unreachable>", RetryAfter: 1}, true},
		{"not found", http.StatusNotFound, pageData{Kind: pageNotFound, SandboxID: hostileID, Port: 8080}, false},
		{"killed", http.StatusServiceUnavailable, pageData{Kind: pageKilled, SandboxID: "abc", Port: 3000, State: "killed", Reason: "oom", CanWake: true}, false},
		{"expired without wake", http.StatusServiceUnavailable, pageData{Kind: pageExpired, SandboxID: "abc", Port: 3000, State: "expired"}, false},
		{"expired with wake", http.StatusServiceUnavailable, pageData{Kind: pageExpired, SandboxID: "abc", Port: 3000, State: "expired", CanWake: true}, false},
		{"error", http.StatusServiceUnavailable, pageData{Kind: pageError, SandboxID: hostileID, Port: 3000, State: "error", Reason: hostileError, CanWake: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := renderPageForTest(t, http.MethodGet, tt.status, tt.d)
			body := w.Body.String()

			if w.Code != tt.status {
				t.Errorf("status = %d, want %d", w.Code, tt.status)
			}
			h := w.Header()
			for k, want := range map[string]string{
				"Content-Type":   "text/html; charset=utf-8",
				"Cache-Control":  "no-store",
				"X-Robots-Tag":   "noindex",
				"Content-Length": strconv.Itoa(len(body)),
			} {
				if got := h.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if tt.d.RetryAfter > 0 {
				if got, want := h.Get("Retry-After"), strconv.Itoa(tt.d.RetryAfter); got != want {
					t.Errorf("Retry-After = %q, want %q", got, want)
				}
			} else if _, ok := h["Retry-After"]; ok {
				t.Errorf("Retry-After = %q, want none", h.Get("Retry-After"))
			}

			for _, s := range []string{
				"<!doctype html>",
				`<meta name="viewport" content="width=device-width, initial-scale=1">`,
				`<body data-kind="` + tt.d.Kind + `"`,
				`data-live="` + strconv.FormatBool(tt.live) + `"`,
			} {
				if !strings.Contains(body, s) {
					t.Errorf("body lacks %q", s)
				}
			}
			for _, id := range []string{"sandwake-state", "sandwake-elapsed", "sandwake-title", "sandwake-message"} {
				if elementTag(body, id) == "" {
					t.Errorf("body lacks id %q", id)
				}
			}
			if hidden := strings.Contains(elementTag(body, "sandwake-elapsed"), " hidden"); hidden == tt.live {
				t.Errorf("elapsed hidden = %v on a page with live = %v", hidden, tt.live)
			}
			if got := elementTag(body, "sandwake-wake") != ""; got != tt.d.CanWake {
				t.Errorf("wake button present = %v, want %v", got, tt.d.CanWake)
			}
			if tt.d.CanWake && !strings.Contains(body, `<form id="sandwake-wake-form" method="post" action="/.well-known/sandwake/wake">`) {
				t.Errorf("wake button is not a POST form to the wake path")
			}
			if elementTag(body, "sandwake-error") != "" {
				t.Errorf("a server-rendered error element: pages are public and show no error text")
			}

			refresh := regexp.MustCompile(`<noscript><meta http-equiv="refresh" content="(\d+)"></noscript>`).FindStringSubmatch(body)
			if tt.live {
				want := strconv.Itoa(pageRefreshSeconds(tt.d.RetryAfter))
				if refresh == nil || refresh[1] != want {
					t.Errorf("meta refresh = %v, want content %s", refresh, want)
				}
				if !strings.Contains(body, "new EventSource(") {
					t.Errorf("live page does not follow events")
				}
				if !regexp.MustCompile(`live:\s*true\s*,`).MatchString(body) {
					t.Errorf("live page script not configured as live")
				}
				if !strings.Contains(body, `class="spinner"`) {
					t.Errorf("live page lacks a spinner")
				}
			} else {
				if refresh != nil || strings.Contains(body, "http-equiv") {
					t.Errorf("non-live page has a meta refresh")
				}
				if strings.Contains(body, "EventSource") != tt.d.CanWake {
					// The script, and with it the event stream, is only there to follow a Wake click.
					t.Errorf("EventSource on a non-live page = %v, want %v", strings.Contains(body, "EventSource"), tt.d.CanWake)
				}
				if tt.d.CanWake && !regexp.MustCompile(`live:\s*false\s*,`).MatchString(body) {
					t.Errorf("non-live page script configured as live")
				}
			}

			// Everything user-provided arrives escaped; the only script is ours.
			for _, raw := range []string{hostileError, "<img", "alert(2)</script>"} {
				if strings.Contains(body, raw) {
					t.Errorf("body contains unescaped %q", raw)
				}
			}
			wantScripts := 0
			if tt.live || tt.d.CanWake {
				wantScripts = 1
			}
			if n := strings.Count(body, "<script"); n != wantScripts {
				t.Errorf("body has %d <script> elements, want %d", n, wantScripts)
			}
			if tt.d.Reason == hostileError && !strings.Contains(body, `<dd id="sandwake-reason">&lt;script&gt;alert(1)&lt;/script&gt;</dd>`) {
				t.Errorf("reason not shown escaped")
			}
			if tt.d.SandboxID == hostileID && !strings.Contains(body, `&#34;&gt;&lt;img src=x onerror=alert(1)&gt;`) {
				t.Errorf("sandbox id not shown escaped")
			}
		})
	}
}

func TestPageHeadHasNoBody(t *testing.T) {
	withPageNow(t, time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC))
	for _, kind := range pageKinds {
		t.Run(kind, func(t *testing.T) {
			d := pageData{Kind: kind, SandboxID: "abc", Port: 3000, RetryAfter: 3, CanWake: true}
			get := renderPageForTest(t, http.MethodGet, http.StatusServiceUnavailable, d)
			head := renderPageForTest(t, http.MethodHead, http.StatusServiceUnavailable, d)
			if head.Code != http.StatusServiceUnavailable {
				t.Errorf("status = %d, want 503", head.Code)
			}
			if head.Body.Len() != 0 {
				t.Errorf("HEAD body has %d bytes, want 0", head.Body.Len())
			}
			for _, k := range []string{"Content-Type", "Content-Length", "Cache-Control", "X-Robots-Tag", "Retry-After"} {
				if got, want := head.Header().Get(k), get.Header().Get(k); got != want || got == "" {
					t.Errorf("HEAD %s = %q, GET has %q", k, got, want)
				}
			}
		})
	}
}

func TestPageTitleAndMessage(t *testing.T) {
	tests := []struct {
		name        string
		d           pageData
		wantTitle   string
		wantMessage string
	}{
		{"defaults from the kind", pageData{Kind: pageWarming}, "Waking up…", "This preview was asleep."},
		{"given", pageData{Kind: pageWarming, Title: "Hold <on>", Message: "Sandbox & friends"}, "Hold &lt;on&gt;", "Sandbox &amp; friends"},
		{"expired without wake does not promise one", pageData{Kind: pageExpired}, "Preview expired", "was removed.</p>"},
		{"expired with wake explains it", pageData{Kind: pageExpired, CanWake: true}, "Preview expired", "Waking it recreates the container"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := renderPageForTest(t, http.MethodGet, http.StatusServiceUnavailable, tt.d).Body.String()
			for _, s := range []string{
				"<title>" + tt.wantTitle + "</title>",
				`<h1 id="sandwake-title">` + tt.wantTitle + "</h1>",
				tt.wantMessage,
			} {
				if !strings.Contains(body, s) {
					t.Errorf("body lacks %q", s)
				}
			}
		})
	}
}

func TestPageURLsAndSince(t *testing.T) {
	now := time.Date(2026, 11, 23, 5, 1, 5, 0, time.UTC)
	withPageNow(t, now)
	since := time.Date(2026, 11, 23, 5, 0, 0, 123456789, time.FixedZone("CET", 3600))

	body := renderPageForTest(t, http.MethodGet, http.StatusServiceUnavailable,
		pageData{Kind: pageWarming, SandboxID: "abc", State: "paused", Since: since}).Body.String()
	for _, s := range []string{
		`data-since="2026-11-23T04:00:00.123456789Z"`,
		`data-now="2026-11-23T05:01:05Z"`,
		`data-state="paused"`,
		`<span class="time">1 h 01 min</span>`,
		// Empty URLs get the reserved paths, written as JS strings.
		`events: "/.well-known/sandwake/events"`,
		`status: "/.well-known/sandwake/status"`,
		`wake: "/.well-known/sandwake/wake"`,
	} {
		if !strings.Contains(body, s) {
			t.Errorf("body lacks %q", s)
		}
	}

	body = renderPageForTest(t, http.MethodGet, http.StatusServiceUnavailable,
		pageData{Kind: pageCreating}).Body.String()
	if !strings.Contains(body, `data-since=""`) || !strings.Contains(body, `<span class="time"></span>`) {
		t.Errorf("zero Since should leave the counter to the client")
	}
	if !strings.Contains(elementTag(body, "sandwake-state-row"), " hidden") || !strings.Contains(elementTag(body, "sandwake-facts"), " hidden") {
		t.Errorf("an empty state and no sandbox should hide the facts until the script learns the state")
	}
}

func TestPageElapsed(t *testing.T) {
	now := time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)
	withPageNow(t, now)
	tests := []struct {
		ago  time.Duration
		want string
	}{
		{0, "0.0 s"},
		{-time.Second, "0.0 s"}, // Since ahead of the clock
		{1400 * time.Millisecond, "1.4 s"},
		{59900 * time.Millisecond, "59.9 s"},
		{65 * time.Second, "1 min 05 s"},
		{2*time.Hour + 3*time.Minute, "2 h 03 min"},
	}
	for _, tt := range tests {
		if got := pageElapsed(now.Add(-tt.ago)); got != tt.want {
			t.Errorf("pageElapsed(now-%v) = %q, want %q", tt.ago, got, tt.want)
		}
	}
	if got := pageElapsed(time.Time{}); got != "" {
		t.Errorf("pageElapsed(zero) = %q, want empty", got)
	}
}

func TestPageFallback(t *testing.T) {
	d := pageData{Kind: "no_such_kind", SandboxID: "abc", Reason: hostileError, RetryAfter: 4}
	w := renderPageForTest(t, http.MethodGet, http.StatusServiceUnavailable, d)
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("status = %d, want 503", w.Code)
	}
	h := w.Header()
	if got := h.Get("Content-Type"); got != "text/plain; charset=utf-8" {
		t.Errorf("Content-Type = %q, want text/plain", got)
	}
	if h.Get("Cache-Control") != "no-store" || h.Get("X-Robots-Tag") != "noindex" || h.Get("Retry-After") != "4" || h.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("fallback headers = %v", h)
	}
	if body := w.Body.String(); !strings.Contains(body, "sandbox: abc") || !strings.Contains(body, "reason: "+hostileError) {
		t.Errorf("fallback body = %q", body)
	}
}

// Every kind has its file, and every file is a kind (or the base).
func TestPageFilesMatchKinds(t *testing.T) {
	files, err := fs.Glob(pageFiles, "pages/*.html")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"pages/base.html": true}
	for _, kind := range pageKinds {
		want["pages/"+kind+".html"] = true
		if pageTemplates[kind] == nil {
			t.Errorf("no template for kind %q", kind)
		}
	}
	for _, f := range files {
		if !want[f] {
			t.Errorf("%s is not a page kind", f)
		}
		delete(want, f)
	}
	for f := range want {
		t.Errorf("%s missing", f)
	}
}

// TestKilledMessageSaysItOnce: the killed page's message says what happened
// to the container once (the reason's sentence), then what waking does.
func TestKilledMessageSaysItOnce(t *testing.T) {
	for _, reason := range []string{"container_missing", "oom", "exited(137)", ""} {
		msg := killedMessage("abc", reason)
		if n := strings.Count(strings.ToLower(msg), "container"); n > 2 || strings.Contains(msg, "is gone. Its container was removed") {
			t.Errorf("reason %q: %q repeats itself", reason, msg)
		}
		if !strings.Contains(msg, reasonSentence(reason)) || !strings.Contains(msg, "waking sandbox abc recreates its container") {
			t.Errorf("reason %q: %q, want the reason's sentence and what waking does", reason, msg)
		}
	}
}
