package preview_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/preview"
)

func TestPreviewProxiesAndWarms(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)

	resp, body := h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != 200 || !strings.Contains(body, "Hello from the sandbox") {
		t.Fatalf("running sandbox: %d %q", resp.StatusCode, body)
	}

	h.Stop(rec.ID)
	since := time.Now()
	// A browser page load of a stopped sandbox: the warming page at once,
	// and the wake starts without any other request.
	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `data-kind="warming"`) {
		t.Fatalf("stopped sandbox page load: %d %.300q", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("warming headers: %v", resp.Header)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		s := h.State(rec.ID)
		return s == "running", "state " + s
	})
	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != 200 || !strings.Contains(body, "Hello from the sandbox") {
		t.Fatalf("after wake: %d %.200q", resp.StatusCode, body)
	}
	if n := h.StartEvents(rec.ID, since); n != 1 {
		t.Fatalf("%d docker starts, want 1", n)
	}
	// The reserved status path answers from the gate.
	resp, body = h.Preview("GET", host, preview.PathStatus, nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"state": "running"`) {
		t.Fatalf("status: %d %s", resp.StatusCode, body)
	}
}

func TestWakeStormStartsOnceAndKeepsBodies(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(map[string]string{"STARTUP_DELAY": "200ms"})
	host := h.Host(rec.ID, 8080)
	h.Stop(rec.ID)
	since := time.Now()

	const n = 500
	var (
		wg   sync.WaitGroup
		good atomic.Int64
		bad  = make(chan string, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				want := fmt.Sprintf("body-%d-%s", i, strings.Repeat("x", i))
				resp, body := h.Preview("POST", host, "/echo", strings.NewReader(want), http.Header{"Content-Type": {"text/plain"}})
				if resp.StatusCode != 200 || body != "POST\n"+want {
					bad <- fmt.Sprintf("POST %d: %d %.80q", i, resp.StatusCode, body)
					return
				}
			} else {
				resp, body := h.Preview("GET", host, "/healthz", nil, http.Header{"Accept": {"application/json"}})
				if resp.StatusCode != 200 || body != "ok\n" {
					bad <- fmt.Sprintf("GET %d: %d %.80q", i, resp.StatusCode, body)
					return
				}
			}
			good.Add(1)
		}()
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error(b)
	}
	if good.Load() != n {
		t.Fatalf("%d of %d requests answered 200 by the app", good.Load(), n)
	}
	if starts := h.StartEvents(rec.ID, since); starts != 1 {
		t.Fatalf("%d docker starts for %d requests, want exactly 1", starts, n)
	}
}

func TestMalformedHostsNeverWake(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	h.Stop(rec.ID)
	since := time.Now()
	p := h.PreviewPort
	upper := strings.ToUpper(rec.ID)
	tests := []struct {
		host     string
		want     int
		sandwake bool // the site matches the host, so sandwake must answer it
	}{
		{fmt.Sprintf("s-%s_x-8080.preview.localhost:%d", rec.ID, p), 404, true},               // bad id character
		{fmt.Sprintf("s-%s-0.preview.localhost:%d", rec.ID, p), 404, true},                    // port 0
		{fmt.Sprintf("s-%s-65536.preview.localhost:%d", rec.ID, p), 404, true},                // port too big
		{fmt.Sprintf("s-%s-08080.preview.localhost:%d", rec.ID, p), 404, true},                // leading zero
		{fmt.Sprintf("s-%s-9999.preview.localhost:%d", rec.ID, p), 404, true},                 // undeclared port
		{fmt.Sprintf("x.s-%s-8080.preview.localhost:%d", rec.ID, p), 404, false},              // extra label
		{fmt.Sprintf("s-%s-8080.preview.example.com:%d", rec.ID, p), 404, false},              // wrong domain
		{fmt.Sprintf("s-unknown%s-8080.preview.localhost:%d", testenv.RunID(), p), 404, true}, // unknown sandbox
	}
	for _, tt := range tests {
		resp, body := h.Preview("GET", tt.host, "/healthz", nil, nil)
		// Hosts the *.preview.localhost site does not match (extra label,
		// wrong domain) never reach sandwake: Caddy answers them with an
		// empty 200. Either way: not served by the app, nothing woken.
		if resp.StatusCode != tt.want && !(resp.StatusCode == 200 && body == "") {
			t.Errorf("%s: %d %.120q", tt.host, resp.StatusCode, body)
		}
		if tt.sandwake && resp.StatusCode != 404 {
			t.Errorf("%s: %d, want sandwake's 404", tt.host, resp.StatusCode)
		}
	}
	if s := h.State(rec.ID); s != "stopped" {
		t.Fatalf("malformed hosts woke the sandbox: %s", s)
	}
	if n := h.StartEvents(rec.ID, since); n != 0 {
		t.Fatalf("malformed hosts caused %d starts", n)
	}
	// Upper case is the same sandbox: it is normalised, and does wake.
	resp, body := h.Preview("GET", fmt.Sprintf("S-%s-8080.PREVIEW.LOCALHOST:%d", upper, p), "/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("upper-case host: %d %q", resp.StatusCode, body)
	}
}

// engineFor returns the engine behind the harness's current config.
func engineFor(t testing.TB, h *harness) *gateway.Gateway {
	t.Helper()
	e := gateway.Current()
	if e == nil {
		t.Fatal("no engine running")
	}
	return e
}
