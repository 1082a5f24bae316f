package caddymodule

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/internal/testenv"
)

// screenshotDir holds the screenshots the browser tests take, for a person to
// look at; it is git-ignored.
const screenshotDir = "testdata/screenshots"

// browserTimeout bounds each browser step: a wake of the test app takes a few
// seconds, so a minute only runs out when something is broken.
const browserTimeout = 60 * time.Second

// newBrowser starts a headless chromium of its own (own profile directory)
// and returns the context of its first tab. The browser process is ended and
// waited for in t.Cleanup. Without chromium the test is skipped, or fails
// where SANDWAKE_REQUIRE_DOCKER=1 says the full environment (CI) is expected.
func newBrowser(t *testing.T, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if testenv.RequireDocker() {
			t.Fatalf("chromium not found: %v", err)
		}
		t.Skipf("chromium not found: %v", err)
	}
	flags := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.UserDataDir(t.TempDir()),
	}, opts...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), flags...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	// Registered after the harness, so it runs first: the browser closes its
	// event streams before Caddy stops, and exits before its profile
	// directory is removed.
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // kills the browser and waits for it
	})
	// The first action starts the browser; fail here rather than mid-test.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// browse runs actions in the tab with a bounded time.
func browse(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// screenshot saves the visible part of the tab as testdata/screenshots/<name>.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(screenshotDir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// evaluate runs a script in the tab and decodes its result.
func evaluate[T any](t *testing.T, ctx context.Context, script string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](script))
	if err != nil {
		t.Fatalf("evaluating %q: %v", script, err)
	}
	return v
}

// documentLoads records the status of every page (document) response the tab
// receives, in order.
type documentLoads struct {
	mu       sync.Mutex
	statuses []int64
}

func recordDocumentLoads(t *testing.T, ctx context.Context) *documentLoads {
	t.Helper()
	d := &documentLoads{}
	err := chromedp.Listen(ctx, func(ev any) {
		if r, ok := ev.(*network.EventResponseReceived); ok && r.Type == network.ResourceTypeDocument && r.Response != nil {
			d.mu.Lock()
			d.statuses = append(d.statuses, r.Response.Status)
			d.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("listening to the tab: %v", err)
	}
	return d
}

func (d *documentLoads) get() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.statuses)
}

// warmingSelector matches the body of the warming page, and nothing of the app.
const warmingSelector = chromedp.CSS(`body[data-kind="warming"]`)

// TestBrowserWarmingPageBecomesApp opens a stopped sandbox in a real browser:
// it shows the warming page, which turns into the app by itself once the
// sandbox runs, with one container start.
func TestBrowserWarmingPageBecomesApp(t *testing.T) {
	t.Run("desktop", func(t *testing.T) {
		h := newHarness(t, "")
		ctx := newBrowser(t, chromedp.WindowSize(1280, 800))
		rec := h.create(map[string]string{"STARTUP_DELAY": "1500ms"})
		h.stop(rec.ID)
		since := time.Now()
		loads := recordDocumentLoads(t, ctx)

		browse(t, ctx, "opening the stopped sandbox",
			chromedp.Navigate("http://"+h.host(rec.ID, 8080)+"/"),
			chromedp.WaitVisible(warmingSelector),
		)
		screenshot(t, ctx, "warming.png")
		// The app listens only after STARTUP_DELAY, so the page shot above
		// is still the warming page; check that the picture shows it.
		if kind := evaluate[string](t, ctx, `document.body.dataset.kind || ""`); kind != "warming" {
			t.Fatalf("page after the warming screenshot: kind %q, want warming", kind)
		}

		// No click, no reload from here: the page follows the wake itself.
		browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))
		screenshot(t, ctx, "app.png")

		if title := evaluate[string](t, ctx, `document.title`); title != "sandwake testapp" {
			t.Fatalf("title %q, want the app's", title)
		}
		if s := h.state(rec.ID); s != "running" {
			t.Fatalf("state %s after the app showed, want running", s)
		}
		if n := h.startEvents(rec.ID, since); n != 1 {
			t.Fatalf("%d docker starts, want 1", n)
		}
		// The page reloaded itself once, straight into the app: no error
		// page (502) from reloading before the app answered.
		if got, want := fmt.Sprint(loads.get()), "[503 200]"; got != want {
			t.Fatalf("page loads answered %s, want %s (warming, then the app)", got, want)
		}
	})

	t.Run("phone", func(t *testing.T) {
		h := newHarness(t, "")
		ctx := newBrowser(t)
		rec := h.create(map[string]string{"STARTUP_DELAY": "1500ms"})
		h.stop(rec.ID)

		const width = 390
		browse(t, ctx, "opening the stopped sandbox on a phone",
			chromedp.EmulateViewport(width, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
			chromedp.Navigate("http://"+h.host(rec.ID, 8080)+"/"),
			chromedp.WaitVisible(warmingSelector),
		)
		screenshot(t, ctx, "warming-phone.png")
		type layout struct {
			Kind        string  `json:"kind"`
			ScrollWidth int     `json:"scrollWidth"`
			CardRight   float64 `json:"cardRight"`
		}
		got := evaluate[layout](t, ctx, `({
			kind: document.body.dataset.kind || "",
			scrollWidth: document.documentElement.scrollWidth,
			cardRight: document.querySelector(".card").getBoundingClientRect().right
		})`)
		if got.Kind != "warming" {
			t.Fatalf("measured page kind %q, want warming", got.Kind)
		}
		if got.ScrollWidth > width || got.CardRight > width {
			t.Fatalf("warming page overflows a %d px phone: scrollWidth %d, card right edge %.1f", width, got.ScrollWidth, got.CardRight)
		}
		// Let the wake finish before the sandbox is removed.
		browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))
	})
}

// watchStateLine is run in every document of the tab before its own
// scripts: it records in sessionStorage (which the app's page, on the same
// origin, can still read after the reload) every text the warming page's
// state line takes and every answer of the status endpoint the page reads.
const watchStateLine = `(function () {
  var KEY = "sandwake-test.seen";
  function log(entry) {
    var seen = JSON.parse(sessionStorage.getItem(KEY) || "[]");
    seen.push(entry);
    sessionStorage.setItem(KEY, JSON.stringify(seen));
  }
  new MutationObserver(function (records) {
    records.forEach(function (r) {
      if (r.type === "characterData" && r.target.parentNode && r.target.parentNode.id === "sandwake-state") {
        log({ shown: r.target.data });
        return;
      }
      r.addedNodes.forEach(function (n) {
        if (r.target.id === "sandwake-state" || n.id === "sandwake-state") { log({ shown: n.textContent }); }
      });
    });
  }).observe(document, { subtree: true, childList: true, characterData: true });
  var realFetch = window.fetch;
  window.fetch = function (url) {
    return realFetch.apply(this, arguments).then(function (res) {
      if (String(url).indexOf("/.well-known/sandwake/status") >= 0) {
        res.clone().json().then(function (st) { log({ status: st.state, waking: !!st.waking }); }, function () {});
      }
      return res;
    });
  };
})();`

// TestBrowserWarmingPageShowsStarting: while a wake runs, the warming page
// reads the sandbox's status (its record still says stopped, with waking
// true) and its state line says "starting", never "stopped"; then the page
// turns into the app by itself.
func TestBrowserWarmingPageShowsStarting(t *testing.T) {
	h := newHarness(t, "")
	ctx := newBrowser(t, chromedp.WindowSize(1280, 800))
	// The app listens only after this delay: the wake, and the page's
	// status reads, happen while it lasts.
	rec := h.create(map[string]string{"STARTUP_DELAY": "3s"})
	h.stop(rec.ID)
	since := time.Now()
	loads := recordDocumentLoads(t, ctx)
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: watchStateLine}); err != nil {
		t.Fatalf("adding the watching script: %v", err)
	}

	browse(t, ctx, "opening the stopped sandbox",
		chromedp.Navigate("http://"+h.host(rec.ID, 8080)+"/"),
		chromedp.WaitVisible(warmingSelector),
	)
	screenshot(t, ctx, "warming-starting.png")
	// No click, no reload from here: the page follows the wake itself.
	browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))

	type seen struct {
		Shown  *string `json:"shown"`
		Status *string `json:"status"`
		Waking bool    `json:"waking"`
	}
	entries := evaluate[[]seen](t, ctx, `JSON.parse(sessionStorage.getItem("sandwake-test.seen") || "[]")`)
	var shown []string
	readWhileWaking := false
	for _, s := range entries {
		switch {
		case s.Shown != nil:
			shown = append(shown, *s.Shown)
		case s.Status != nil:
			readWhileWaking = readWhileWaking || (*s.Status == "stopped" && s.Waking)
		}
	}
	t.Logf("state line: %q; status reads: %d entries in all", shown, len(entries)-len(shown))
	if !readWhileWaking {
		t.Fatalf("the page never read the status while the wake ran (stopped, waking): %+v", entries)
	}
	if len(shown) == 0 || shown[0] != "starting" {
		t.Fatalf("state line showed %q, want \"starting\" first", shown)
	}
	for _, s := range shown {
		if s != "starting" && s != "running" {
			t.Fatalf("state line showed %q while the sandbox woke (all: %q), want only starting, then running", s, shown)
		}
	}
	if title := evaluate[string](t, ctx, `document.title`); title != "sandwake testapp" {
		t.Fatalf("title %q, want the app's", title)
	}
	if n := h.startEvents(rec.ID, since); n != 1 {
		t.Fatalf("%d docker starts, want 1", n)
	}
	if got, want := fmt.Sprint(loads.get()), "[503 200]"; got != want {
		t.Fatalf("page loads answered %s, want %s (warming, then the app)", got, want)
	}
}
