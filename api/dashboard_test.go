package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/api"
	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/internal/web"
)

// dashboardServer serves the dashboard at / and proxies /v1/ to the
// harness's API, so the page runs against the real API whether or not the
// API serves the page itself. Streams are passed on at once. Without
// withEvents, GET /v1/events answers 404 as an API without it would.
type dashboardServer struct {
	*httptest.Server
	mu       sync.Mutex
	resumes  []string             // Last-Event-ID of each GET /v1/events
	dropping []context.CancelFunc // ends the event streams open now
}

// resumedFrom returns the Last-Event-ID headers of the event stream
// requests so far, in order.
func (d *dashboardServer) resumedFrom() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.resumes...)
}

// dropStreams breaks the event streams open now, as a lost connection would.
func (d *dashboardServer) dropStreams() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cancel := range d.dropping {
		cancel()
	}
	d.dropping = nil
}

func newDashboardServer(t *testing.T, h *harness, withEvents bool) *dashboardServer {
	t.Helper()
	target, err := url.Parse(h.APIURL(""))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", api.ServeDashboard)
	mux.HandleFunc("GET /index.html", api.ServeDashboard)
	mux.Handle("/v1/", proxy)
	d := &dashboardServer{}
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		if !withEvents {
			web.WriteError(w, http.StatusNotFound, "not_found", "no API route GET /v1/events", 0)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		d.mu.Lock()
		d.resumes = append(d.resumes, r.Header.Get("Last-Event-ID"))
		d.dropping = append(d.dropping, cancel)
		d.mu.Unlock()
		proxy.ServeHTTP(w, r.WithContext(ctx))
	})
	d.Server = httptest.NewServer(mux)
	t.Cleanup(d.Server.Close)
	return d
}

// eventsAvailable reports whether the API serves GET /v1/events.
func eventsAvailable(t *testing.T, h *harness) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.APIURL("/v1/events"), nil)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("probing /v1/events: %v", err)
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// dialogs answers the page's prompt() and confirm() dialogs: a prompt gets
// the text set with answer, a confirm is accepted.
type dialogs struct {
	mu     sync.Mutex
	text   string
	opened []string
}

func (d *dialogs) answer(text string) {
	d.mu.Lock()
	d.text = text
	d.mu.Unlock()
}

func (d *dialogs) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.opened...)
}

func handleDialogs(t *testing.T, ctx context.Context) *dialogs {
	t.Helper()
	d := &dialogs{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	opening := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		defer close(done)
		for ev, err := range opening {
			if err != nil {
				return
			}
			d.mu.Lock()
			d.opened = append(d.opened, string(ev.Type))
			text := d.text
			d.mu.Unlock()
			// Not from the goroutine that reads the events (see chromedp.Events).
			go func() {
				_, err := chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true, PromptText: text})
				if err != nil && ctx.Err() == nil {
					t.Errorf("answering the %s dialog: %v", ev.Type, err)
				}
			}()
		}
	}()
	return d
}

// signIn opens the dashboard at url and signs in with token.
func signIn(url, token string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.ID("token-form")),
		chromedp.SendKeys(chromedp.ID("token-input"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	)
}

// rowSel is a CSS selector inside the dashboard row of sandbox id.
func rowSel(id, inner string) chromedp.CSS {
	return chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] %s`, id, inner))
}

// darkMode makes the tab prefer a dark color scheme, or not.
func darkMode(t *testing.T, ctx context.Context, on bool) {
	t.Helper()
	p := emulation.SetEmulatedMediaParams{}
	if on {
		p.Features = []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}
	}
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, p); err != nil {
		t.Fatalf("emulating dark mode: %v", err)
	}
}

// selectState picks a state in the filter as a person would. (SetValue cannot
// select the empty value "all": chromedp sends the empty string as undefined.)
func selectState(state string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(function (s) {
		s.value = %q;
		s.dispatchEvent(new Event("change", { bubbles: true }));
	})(document.getElementById("state-filter"))`, state))
}

// TestDashboardInBrowser runs the dashboard in chromium against the real API:
// sign in, see the sandboxes, follow a change made elsewhere without a
// reload, and act on sandboxes with the row buttons.
func TestDashboardInBrowser(t *testing.T) {
	h := newHarness(t, "")
	a := h.Create(nil)
	b := h.Create(nil)
	var paused client.Sandbox
	if status := h.API("POST", "/v1/sandboxes/"+b.ID+"/pause", nil, &paused); status != 200 || paused.State != "paused" {
		t.Fatalf("pause: %d %+v", status, paused)
	}
	live := eventsAvailable(t, h)
	t.Logf("GET /v1/events available: %v", live)
	srv := newDashboardServer(t, h, true)
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	dlg := handleDialogs(t, ctx)

	gatewaytest.Browse(t, ctx, "signing in",
		chromedp.EmulateViewport(1280, 800),
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
		chromedp.WaitVisible(rowSel(b.ID, `td.state[data-state="paused"]`)),
	)
	if live {
		gatewaytest.Browse(t, ctx, "waiting for the live stream", chromedp.WaitVisible(chromedp.CSS(`#live[data-status="live"]`)))
	} else {
		gatewaytest.Browse(t, ctx, "waiting for the live indicator to give up", chromedp.WaitVisible(chromedp.CSS(`#live[data-status="offline"]`)))
	}
	gatewaytest.Screenshot(t, ctx, "dashboard.png")

	type rowFacts struct {
		Token    string `json:"token"`
		CSP      string `json:"csp"`
		FormOpen bool   `json:"formOpen"`
		Href     string `json:"href"`
		Target   string `json:"target"`
		Rel      string `json:"rel"`
		Conns    string `json:"conns"`
		Age      string `json:"age"`
		Active   string `json:"active"`
		Buttons  string `json:"buttons"`
		Bg       string `json:"bg"`
	}
	facts := gatewaytest.Evaluate[rowFacts](t, ctx, fmt.Sprintf(`(function () {
		var tr = document.querySelector('tr[data-id=%q]'), link = tr.querySelector("td.links a");
		return {
			token: sessionStorage.getItem("sandwake.api_token") || "",
			csp: document.documentElement.getAttribute("data-csp-violations") || "",
			bg: getComputedStyle(document.body).backgroundColor,
			formOpen: !document.getElementById("token-form").hidden,
			href: link ? link.href : "", target: link ? link.target : "", rel: link ? link.rel : "",
			conns: tr.querySelector("td.conns").textContent,
			age: tr.querySelector("td.age").textContent,
			active: tr.querySelector("td.active .when").textContent,
			buttons: Array.prototype.map.call(tr.querySelectorAll("button[data-action]"), function (b) {
				return b.getAttribute("data-action") + (b.disabled ? "-" : "+");
			}).join(" ")
		};
	})()`, a.ID))
	if facts.Token != gatewaytest.Token {
		t.Errorf("sessionStorage token %q, want the one entered", facts.Token)
	}
	if facts.CSP != "" {
		t.Errorf("%s Content-Security-Policy violations", facts.CSP)
	}
	// The style sheet ran under the CSP (a blocked one would leave the
	// browser's white background; its violation fires before the script
	// can count it).
	if facts.Bg != "rgb(245, 246, 248)" {
		t.Errorf("body background %q, want the page's rgb(245, 246, 248): style blocked?", facts.Bg)
	}
	if facts.FormOpen {
		t.Errorf("token form still shown after signing in")
	}
	if facts.Href != a.URLs["8080"] || facts.Target != "_blank" || !strings.Contains(" "+facts.Rel+" ", " noopener ") {
		t.Errorf("preview link: href %q target %q rel %q, want %q _blank noopener", facts.Href, facts.Target, facts.Rel, a.URLs["8080"])
	}
	if facts.Conns != "0" || facts.Age == "" || facts.Active == "" {
		t.Errorf("row cells: conns %q age %q last active %q", facts.Conns, facts.Age, facts.Active)
	}
	if want := "wake- pause+ stop+ keepalive+ destroy+"; facts.Buttons != want {
		t.Errorf("buttons of a running sandbox: %q, want %q", facts.Buttons, want)
	}

	gatewaytest.Browse(t, ctx, "filtering by state",
		selectState("paused"),
		chromedp.WaitNotVisible(rowSel(a.ID, "td.state")),
		chromedp.WaitVisible(rowSel(b.ID, "td.state")),
		selectState(""),
		chromedp.WaitVisible(rowSel(a.ID, "td.state")),
	)

	// A change made elsewhere shows without a reload: by the event stream
	// when the API has one, else by the periodic list refresh (15 s).
	h.Stop(a.ID)
	func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(wctx, chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="stopped"]`))); err != nil {
			t.Fatalf("row of %s did not turn stopped within 30 s: %v", a.ID, err)
		}
	}()
	source := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q]').getAttribute("data-state-source")`, a.ID))
	status := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("live").getAttribute("data-status")`)
	t.Logf("row turned stopped by: %s (live indicator %s)", source, status)
	if live && source != "event" {
		t.Errorf("with /v1/events the row changed by %q, want event", source)
	}
	if !live && source != "list" {
		t.Errorf("without /v1/events the row changed by %q, want list", source)
	}
	gatewaytest.Screenshot(t, ctx, "dashboard-stopped.png")
	// A stopped row says when it was stopped, not "last active: just now";
	// its preview link names the port in words.
	if when := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q] td.active .when').textContent`, a.ID)); !strings.HasPrefix(when, "stopped ") {
		t.Errorf("active cell of a stopped sandbox: %q, want \"stopped …\"", when)
	}
	if text := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q] td.links a').textContent`, a.ID)); text != "port 8080" {
		t.Errorf("preview link text %q, want \"port 8080\"", text)
	}

	if live {
		// A broken stream is reopened, resuming after the last event seen.
		var hist struct {
			Events []struct {
				ID uint64 `json:"id"`
			} `json:"events"`
		}
		h.API("GET", "/v1/sandboxes/"+a.ID+"/history", nil, &hist)
		if len(hist.Events) == 0 {
			t.Fatalf("no history for %s", a.ID)
		}
		stopEvent := hist.Events[len(hist.Events)-1].ID
		before := len(srv.resumedFrom())
		srv.dropStreams()
		testenv.Eventually(t, 15*time.Second, func() (bool, string) {
			n := len(srv.resumedFrom())
			return n > before, fmt.Sprintf("%d event stream requests, want more than %d", n, before)
		})
		gatewaytest.Browse(t, ctx, "waiting for the stream to be back", chromedp.WaitVisible(chromedp.CSS(`#live[data-status="live"]`)))
		resumes := srv.resumedFrom()
		got := resumes[len(resumes)-1]
		if n, err := strconv.ParseUint(got, 10, 64); err != nil || n < stopEvent {
			t.Errorf("reconnected with Last-Event-ID %q, want at least %d (the stop event); all: %q", got, stopEvent, resumes)
		}
		t.Logf("event stream requests, by Last-Event-ID: %q", resumes)
	}

	gatewaytest.Browse(t, ctx, "waking from the row",
		chromedp.Click(rowSel(a.ID, `button[data-action="wake"]`)),
		chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#message[data-kind="info"]`)),
	)
	if s := h.State(a.ID); s != "running" {
		t.Fatalf("API says %s after Wake, want running", s)
	}

	// Keepalive asks for a duration; an invalid one shows the API's error.
	dlg.answer("soon")
	gatewaytest.Browse(t, ctx, "keepalive with a bad duration",
		chromedp.Click(rowSel(a.ID, `button[data-action="keepalive"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#message[data-kind="error"]`)),
	)
	if msg := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("message").textContent`); !strings.Contains(msg, `"soon" is not a duration`) {
		t.Errorf("message after a bad keepalive: %q, want the API's error", msg)
	}
	dlg.answer("5m")
	gatewaytest.Browse(t, ctx, "keepalive",
		chromedp.Click(rowSel(a.ID, `button[data-action="keepalive"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#message[data-kind="info"]`)),
	)
	var kept client.Sandbox
	h.API("GET", "/v1/sandboxes/"+a.ID, nil, &kept)
	if kept.KeepaliveUntil == nil || !kept.KeepaliveUntil.After(time.Now()) {
		t.Errorf("keepalive_until %v after Keepalive 5m, want in the future", kept.KeepaliveUntil)
	}
	gatewaytest.Browse(t, ctx, "showing the keepalive", chromedp.WaitVisible(rowSel(a.ID, "td.active .keepalive")))
	darkMode(t, ctx, true)
	gatewaytest.Screenshot(t, ctx, "dashboard-dark.png")
	darkMode(t, ctx, false)

	gatewaytest.Browse(t, ctx, "destroying from the row",
		chromedp.Click(rowSel(b.ID, `button[data-action="destroy"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q]`, b.ID))),
	)
	if status := h.API("GET", "/v1/sandboxes/"+b.ID, nil, nil); status != http.StatusNotFound {
		t.Errorf("GET of the destroyed sandbox: %d, want 404", status)
	}
	if got := fmt.Sprint(dlg.seen()); got != "[prompt prompt confirm]" {
		t.Errorf("dialogs %s, want [prompt prompt confirm]", got)
	}

	// A phone: the page fits the width; only the table scrolls, inside its card.
	const width = 390
	gatewaytest.Browse(t, ctx, "opening on a phone",
		chromedp.EmulateViewport(width, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
		chromedp.Reload(),
		chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
	)
	gatewaytest.Screenshot(t, ctx, "dashboard-phone.png")
	type layout struct {
		ScrollWidth int     `json:"scrollWidth"`
		WrapRight   float64 `json:"wrapRight"`
		LiveRight   float64 `json:"liveRight"`
	}
	got := gatewaytest.Evaluate[layout](t, ctx, `({
		scrollWidth: document.documentElement.scrollWidth,
		wrapRight: document.querySelector(".table-wrap").getBoundingClientRect().right,
		liveRight: document.getElementById("live").getBoundingClientRect().right
	})`)
	if got.ScrollWidth > width || got.WrapRight > width || got.LiveRight > width {
		t.Errorf("dashboard overflows a %d px phone: %+v", width, got)
	}

	// A token the API refuses: back to the form, with a message.
	gatewaytest.Browse(t, ctx, "using a wrong token",
		chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem("sandwake.api_token", "wrong-token")`),
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.ID("token-form")),
		chromedp.WaitVisible(chromedp.CSS(`#message[data-kind="error"]`)),
	)
	gatewaytest.Screenshot(t, ctx, "dashboard-token.png")
	if tok := gatewaytest.Evaluate[string](t, ctx, `sessionStorage.getItem("sandwake.api_token") || ""`); tok != "" {
		t.Errorf("token %q kept after a 401", tok)
	}
	if msg := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("message").textContent`); !strings.Contains(msg, "401") {
		t.Errorf("message after a 401: %q", msg)
	}
}

// TestDashboardWithoutEventsInBrowser runs the dashboard against an API
// without GET /v1/events: the indicator says offline and the periodic list
// refresh still shows a change made elsewhere, without a reload.
func TestDashboardWithoutEventsInBrowser(t *testing.T) {
	h := newHarness(t, "")
	a := h.Create(nil)
	srv := newDashboardServer(t, h, false)
	ctx := gatewaytest.NewBrowser(t)
	gatewaytest.Browse(t, ctx, "signing in",
		chromedp.EmulateViewport(1280, 800),
		signIn(srv.URL+"/index.html", gatewaytest.Token),
		chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#live[data-status="offline"]`)),
	)
	if msg := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("message").hidden ? "" : document.getElementById("message").textContent`); msg != "" {
		t.Errorf("message %q: a missing event stream is not an error to show", msg)
	}
	h.Stop(a.ID)
	func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(wctx, chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="stopped"]`))); err != nil {
			t.Fatalf("row of %s did not turn stopped within 30 s: %v", a.ID, err)
		}
	}()
	if source := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q]').getAttribute("data-state-source")`, a.ID)); source != "list" {
		t.Errorf("row changed by %q, want list", source)
	}
	if status := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("live").getAttribute("data-status")`); status != "offline" {
		t.Errorf("live indicator %q, want offline", status)
	}
	gatewaytest.Screenshot(t, ctx, "dashboard-offline.png")
}
