package preview

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// pageData is what every page template receives.
type pageData struct {
	Kind       string // one of the page kinds below
	Title      string // <title> and heading
	Message    string // one human sentence explaining what is happening
	SandboxID  string
	Port       int
	State      string    // sandbox state: creating, running, paused, stopped, killed, expired, error
	Reason     string    // the record's reason code; never the raw error, pages are public
	Since      time.Time // when the wake (or the state) began; zero if unknown
	CanWake    bool      // show a Wake button (POST to WakeURL)
	EventsURL  string    // "/.well-known/sandwake/events"
	StatusURL  string    // "/.well-known/sandwake/status"
	WakeURL    string    // "/.well-known/sandwake/wake"
	RetryAfter int       // seconds; >0 sets Retry-After and the no-JS meta refresh
}

// page kinds
const (
	pageWarming      = "warming"      // sandbox is waking: auto-reloads when running
	pageNotFound     = "not_found"    // unknown sandbox, undeclared port, malformed host (404)
	pageCreating     = "creating"     // still being created (auto-reloads like warming)
	pageKilled       = "killed"       // container gone; Wake button
	pageExpired      = "expired"      // removed at max lifetime; Wake button if CanWake
	pageError        = "error"        // failed create/wake; shows the reason; Wake button
	pageCapacity     = "capacity"     // host full (503); auto-retries
	pageUnavailable  = "unavailable"  // gateway not ready / docker unreachable (503); auto-retries
	pageUnauthorized = "unauthorized" // private sandbox without a valid token (401)
	pageAsleep       = "asleep"       // sleeping sandbox shown to a crawler, not woken (503)
)

// pageKinds lists every kind; each has a pages/<kind>.html.
var pageKinds = []string{
	pageWarming, pageNotFound, pageCreating, pageKilled,
	pageExpired, pageError, pageCapacity, pageUnavailable,
	pageUnauthorized, pageAsleep,
}

// The reserved paths a page talks to when the caller leaves them empty.
const (
	pageDefaultEventsURL = "/.well-known/sandwake/events"
	pageDefaultStatusURL = "/.well-known/sandwake/status"
	pageDefaultWakeURL   = "/.well-known/sandwake/wake"
)

// pageDefaultRefresh is the no-JS meta refresh, in seconds, when RetryAfter is unset.
const pageDefaultRefresh = 2

//go:embed pages/*.html
var pageFiles embed.FS

// pageNow is the clock used for the server-rendered elapsed time; tests replace it.
var pageNow = time.Now

// pageTemplates holds one template per kind: the shared base (pages/base.html)
// cloned and completed with that kind's blocks. Parsed once; a broken template
// is a build mistake, so it panics at init.
var pageTemplates = parsePageTemplates()

func parsePageTemplates() map[string]*template.Template {
	base := template.Must(template.New("base.html").Funcs(template.FuncMap{
		"live":       pageIsLive,
		"timedRetry": pageRetriesOnTimer,
		"refresh":    pageRefreshSeconds,
		"since":      pageSinceAttr,
		"elapsed":    pageElapsed,
		"now":        func() time.Time { return pageNow() },
	}).ParseFS(pageFiles, "pages/base.html"))
	m := make(map[string]*template.Template, len(pageKinds))
	for _, kind := range pageKinds {
		t := template.Must(base.Clone())
		m[kind] = template.Must(t.ParseFS(pageFiles, "pages/"+kind+".html"))
	}
	return m
}

// pageIsLive reports whether a kind follows the sandbox and reloads by itself.
func pageIsLive(kind string) bool {
	switch kind {
	case pageWarming, pageCreating, pageCapacity, pageUnavailable:
		return true
	}
	return false
}

// pageRetriesOnTimer reports whether a live page also reloads after RetryAfter:
// a full host or an unready gateway changes without an event for this sandbox.
func pageRetriesOnTimer(kind string) bool {
	return kind == pageCapacity || kind == pageUnavailable
}

func pageRefreshSeconds(retryAfter int) int {
	if retryAfter > 0 {
		return retryAfter
	}
	return pageDefaultRefresh
}

func pageSinceAttr(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// pageElapsed is the elapsed time as of rendering, so that a browser without
// JS still sees it advance on each meta refresh. The page's script formats it
// the same way.
func pageElapsed(since time.Time) string {
	if since.IsZero() {
		return ""
	}
	d := pageNow().Sub(since)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min %02d s", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%d h %02d min", int(d.Hours()), int(d.Minutes())%60)
	}
}

// renderPage writes a full HTML page with the given status. Headers: Content-Type
// "text/html; charset=utf-8", Cache-Control "no-store", X-Robots-Tag "noindex",
// Retry-After (when d.RetryAfter > 0). A HEAD request gets headers only. If the
// template fails, it writes a plain-text fallback (never panics).
func renderPage(w http.ResponseWriter, r *http.Request, status int, d pageData) {
	if d.EventsURL == "" {
		d.EventsURL = pageDefaultEventsURL
	}
	if d.StatusURL == "" {
		d.StatusURL = pageDefaultStatusURL
	}
	if d.WakeURL == "" {
		d.WakeURL = pageDefaultWakeURL
	}

	contentType := "text/html; charset=utf-8"
	body, err := executePage(d)
	if err != nil {
		contentType = "text/plain; charset=utf-8"
		body = pageFallback(d)
	}

	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Robots-Tag", "noindex")
	h.Set("X-Content-Type-Options", "nosniff")
	if d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(d.RetryAfter))
	} else {
		h.Del("Retry-After")
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// executePage renders into a buffer first so that a failing template never
// leaves a half-written page behind a status already sent.
func executePage(d pageData) (body []byte, err error) {
	t, ok := pageTemplates[d.Kind]
	if !ok {
		return nil, fmt.Errorf("no page for kind %q", d.Kind)
	}
	defer func() {
		// A template calling into a panicking value must not take the handler down.
		if p := recover(); p != nil {
			body, err = nil, fmt.Errorf("rendering page %q: panic: %v", d.Kind, p)
		}
	}()
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "base.html", d); err != nil {
		return nil, fmt.Errorf("rendering page %q: %w", d.Kind, err)
	}
	return buf.Bytes(), nil
}

// pageFallback is the plain-text answer when a page cannot be rendered. It is
// served as text/plain with nosniff, so user-provided text needs no escaping.
func pageFallback(d pageData) []byte {
	var b strings.Builder
	title := d.Title
	if title == "" {
		title = "sandwake: " + strings.ReplaceAll(d.Kind, "_", " ")
	}
	b.WriteString(title + "\n")
	if d.Message != "" {
		b.WriteString(d.Message + "\n")
	}
	if d.SandboxID != "" {
		fmt.Fprintf(&b, "sandbox: %s\n", d.SandboxID)
	}
	if d.Port > 0 {
		fmt.Fprintf(&b, "port: %d\n", d.Port)
	}
	if d.State != "" {
		fmt.Fprintf(&b, "state: %s\n", d.State)
	}
	if d.Reason != "" {
		fmt.Fprintf(&b, "reason: %s\n", d.Reason)
	}
	if d.CanWake {
		fmt.Fprintf(&b, "wake: POST %s\n", d.WakeURL)
	}
	if pageIsLive(d.Kind) {
		fmt.Fprintf(&b, "retry in %d s\n", pageRefreshSeconds(d.RetryAfter))
	}
	return []byte(b.String())
}
