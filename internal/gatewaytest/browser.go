package gatewaytest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/internal/testenv"
)

// screenshotDir holds the screenshots the browser tests take, for a person to
// look at; it is git-ignored.
const screenshotDir = "testdata/screenshots"

// browserTimeout bounds each browser step: a wake of the test app takes a few
// seconds, so a minute only runs out when something is broken.
const browserTimeout = 60 * time.Second

// NewBrowser starts a headless chromium of its own (own profile directory)
// and returns the context of its first tab. The browser process is ended and
// waited for in t.Cleanup. Without chromium the test is skipped, or fails
// where SANDWAKE_REQUIRE_DOCKER=1 says the full environment (CI) is expected.
func NewBrowser(t *testing.T, opts ...chromedp.ExecAllocatorOption) context.Context {
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

// Browse runs actions in the tab with a bounded time.
func Browse(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Screenshot saves the visible part of the tab as testdata/screenshots/<name>.
func Screenshot(t *testing.T, ctx context.Context, name string) {
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

// Evaluate runs a script in the tab and decodes its result.
func Evaluate[T any](t *testing.T, ctx context.Context, script string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](script))
	if err != nil {
		t.Fatalf("evaluating %q: %v", script, err)
	}
	return v
}
