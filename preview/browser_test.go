package preview_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/internal/gatewaytest"
)

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
		ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
		rec := h.Create(map[string]string{"STARTUP_DELAY": "1500ms"})
		h.Stop(rec.ID)
		since := time.Now()
		loads := recordDocumentLoads(t, ctx)

		gatewaytest.Browse(t, ctx, "opening the stopped sandbox",
			chromedp.Navigate("http://"+h.Host(rec.ID, 8080)+"/"),
			chromedp.WaitVisible(warmingSelector),
		)
		gatewaytest.Screenshot(t, ctx, "warming.png")
		// The app listens only after STARTUP_DELAY, so the page shot above
		// is still the warming page; check that the picture shows it.
		if kind := gatewaytest.Evaluate[string](t, ctx, `document.body.dataset.kind || ""`); kind != "warming" {
			t.Fatalf("page after the warming screenshot: kind %q, want warming", kind)
		}

		// No click, no reload from here: the page follows the wake itself.
		gatewaytest.Browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))
		gatewaytest.Screenshot(t, ctx, "app.png")

		if title := gatewaytest.Evaluate[string](t, ctx, `document.title`); title != "sandwake testapp" {
			t.Fatalf("title %q, want the app's", title)
		}
		if s := h.State(rec.ID); s != "running" {
			t.Fatalf("state %s after the app showed, want running", s)
		}
		if n := h.StartEvents(rec.ID, since); n != 1 {
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
		ctx := gatewaytest.NewBrowser(t)
		rec := h.Create(map[string]string{"STARTUP_DELAY": "1500ms"})
		h.Stop(rec.ID)

		const width = 390
		gatewaytest.Browse(t, ctx, "opening the stopped sandbox on a phone",
			chromedp.EmulateViewport(width, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
			chromedp.Navigate("http://"+h.Host(rec.ID, 8080)+"/"),
			chromedp.WaitVisible(warmingSelector),
		)
		gatewaytest.Screenshot(t, ctx, "warming-phone.png")
		type layout struct {
			Kind        string  `json:"kind"`
			ScrollWidth int     `json:"scrollWidth"`
			CardRight   float64 `json:"cardRight"`
		}
		got := gatewaytest.Evaluate[layout](t, ctx, `({
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
		gatewaytest.Browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))
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
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	// The app listens only after this delay: the wake, and the page's
	// status reads, happen while it lasts.
	rec := h.Create(map[string]string{"STARTUP_DELAY": "3s"})
	h.Stop(rec.ID)
	since := time.Now()
	loads := recordDocumentLoads(t, ctx)
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: watchStateLine}); err != nil {
		t.Fatalf("adding the watching script: %v", err)
	}

	gatewaytest.Browse(t, ctx, "opening the stopped sandbox",
		chromedp.Navigate("http://"+h.Host(rec.ID, 8080)+"/"),
		chromedp.WaitVisible(warmingSelector),
	)
	gatewaytest.Screenshot(t, ctx, "warming-starting.png")
	// No click, no reload from here: the page follows the wake itself.
	gatewaytest.Browse(t, ctx, "waiting for the app", chromedp.WaitVisible(chromedp.CSS("#app")))

	type seen struct {
		Shown  *string `json:"shown"`
		Status *string `json:"status"`
		Waking bool    `json:"waking"`
	}
	entries := gatewaytest.Evaluate[[]seen](t, ctx, `JSON.parse(sessionStorage.getItem("sandwake-test.seen") || "[]")`)
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
	if title := gatewaytest.Evaluate[string](t, ctx, `document.title`); title != "sandwake testapp" {
		t.Fatalf("title %q, want the app's", title)
	}
	if n := h.StartEvents(rec.ID, since); n != 1 {
		t.Fatalf("%d docker starts, want 1", n)
	}
	if got, want := fmt.Sprint(loads.get()), "[503 200]"; got != want {
		t.Fatalf("page loads answered %s, want %s (warming, then the app)", got, want)
	}
}
