package preview_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus/testutil"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/preview"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// historyOf returns sandbox id's events as the API lists them.
func (h *harness) historyOf(id string) []map[string]any {
	h.T.Helper()
	var out struct {
		Events []map[string]any `json:"events"`
	}
	if status := h.API("GET", "/v1/sandboxes/"+id+"/history", nil, &out); status != http.StatusOK {
		h.T.Fatalf("history of %s: %d", id, status)
	}
	return out.Events
}

// TestAppExitIsHeldThroughRestart: the app's process exits while sandwake
// believes the sandbox runs. The next API request must be held through the
// restart and answered by the app, never with a bare 502, whichever comes
// first: Docker's die event (the record is already stopped) or the request
// (the route still says running and the dial fails).
func TestAppExitIsHeldThroughRestart(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	name := docker.ContainerName(rec.ID)
	since := time.Now()

	for i := range 3 {
		// Subscribe to the container's next exit before causing it, so the
		// exit cannot be missed.
		waitCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		exited := h.Docker.ContainerWait(waitCtx, name, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})

		resp, body := h.Preview("GET", host, "/exit?code=0", nil, gatewaytest.APIHeader())
		if resp.StatusCode != http.StatusOK || body != "exiting\n" {
			cancel()
			t.Fatalf("round %d: /exit: %d %q", i, resp.StatusCode, body)
		}
		// The app exits 10 ms after answering: a request sent at once would
		// still reach the live process. Wait for Docker (not sandwake) to see
		// the exit, then send the request with no further wait, racing
		// sandwake's handling of the die event.
		select {
		case res := <-exited.Result:
			if res.StatusCode != 0 {
				t.Errorf("round %d: exit code %d, want 0", i, res.StatusCode)
			}
		case err := <-exited.Error:
			cancel()
			t.Fatalf("round %d: waiting for the container to exit: %v", i, err)
		}
		cancel()
		if i == 1 {
			// One round with a fixed order: the event first.
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				s := h.State(rec.ID)
				return s == "stopped", "state " + s
			})
		}
		proxiedBefore := testutil.ToFloat64(preview.RequestsProxied)
		start := time.Now()
		resp, body = h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader())
		took := time.Since(start)
		order := "event first (record already stopped)"
		if testutil.ToFloat64(preview.RequestsProxied) > proxiedBefore {
			order = "request first (route still running, dial failed)"
		}
		t.Logf("round %d: %s: %d %q in %s", i, order, resp.StatusCode, body, took)
		if resp.StatusCode != http.StatusOK || body != "ok\n" {
			// Errorf, not Fatalf: the next rounds still show which orders fail.
			t.Errorf("round %d (%s): request after the app exited: %d %.300q, want 200 \"ok\\n\" held through the restart",
				i, order, resp.StatusCode, body)
		}
	}

	found := false
	for _, ev := range h.historyOf(rec.ID) {
		if ev["to"] == "stopped" && ev["reason"] == "exited(0)" {
			found = true
		}
	}
	if !found {
		t.Fatalf("history has no stopped event with reason exited(0): %v", h.historyOf(rec.ID))
	}
	if t.Failed() {
		return // a round got a 502: the sandbox was left stopped
	}
	if s := h.State(rec.ID); s != "running" {
		t.Fatalf("final state %s, want running", s)
	}
	if n := h.StartEvents(rec.ID, since); n < 1 {
		t.Fatalf("%d docker starts since the first exit, want at least 1", n)
	} else {
		t.Logf("%d docker starts for 3 exits", n)
	}
}

// quiescentGoroutines counts goroutines after dropping the test's own idle
// keep-alive connections, which would otherwise be counted.
func quiescentGoroutines(h *harness) int {
	h.Client.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	return runtime.NumGoroutine()
}

// previewCode sends one request to a preview host and returns its status;
// safe to call from any goroutine.
func (h *harness) previewCode(host string, header http.Header) (int, error) {
	req, err := http.NewRequest("GET", "http://"+host+"/", nil)
	if err != nil {
		return 0, err
	}
	req.Header = header
	resp, err := h.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// randomID is a well-formed sandbox id (1-40 of [0-9a-z]) that no test makes:
// test ids start with a letter other than u.
func randomID() string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 1+rand.IntN(39))
	b[0] = 'u'
	for i := 1; i < len(b); i++ {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// TestUnknownIDsNeverWakeOrGrow: a flood of requests to well-formed but
// unknown ids gets 404s and leaves no trace: no record, no event, no cached
// route.
func TestUnknownIDsNeverWakeOrGrow(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	e := engineFor(t, h)

	var list struct {
		Sandboxes []swclient.Sandbox `json:"sandboxes"`
	}
	if status := h.API("GET", "/v1/sandboxes", nil, &list); status != http.StatusOK {
		t.Fatalf("list: %d", status)
	}
	recordsBefore := len(list.Sandboxes)
	lastBefore, err := e.Mgr.LastEventID()
	if err != nil {
		t.Fatal(err)
	}
	cachedBefore := e.Routes.Len()
	trackedBefore := e.Mgr.Tracked()
	notFoundBefore := testutil.ToFloat64(preview.MetricRequests.WithLabelValues(preview.OutcomeNotFound))

	const n, workers = 2000, 16
	jobs := make(chan int)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
		ok       int
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				host := h.Host(randomID(), 8080)
				header := gatewaytest.APIHeader()
				if i%2 == 1 {
					header = gatewaytest.BrowserHeader()
				}
				status, err := h.previewCode(host, header)
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, fmt.Sprintf("%s: %v", host, err))
				case status != http.StatusNotFound:
					failures = append(failures, fmt.Sprintf("%s: %d, want 404", host, status))
				default:
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	for i, f := range failures {
		if i == 20 {
			t.Errorf("… and %d more", len(failures)-20)
			break
		}
		t.Error(f)
	}
	if ok != n {
		t.Fatalf("%d of %d requests to unknown ids got 404", ok, n)
	}

	if status := h.API("GET", "/v1/sandboxes", nil, &list); status != http.StatusOK {
		t.Fatalf("list: %d", status)
	}
	if tracked := e.Mgr.Tracked(); tracked != trackedBefore {
		t.Fatalf("%d activity trackers after %d requests to unknown ids, %d before", tracked, n, trackedBefore)
	}
	if len(list.Sandboxes) != recordsBefore {
		t.Fatalf("%d records after the flood, %d before", len(list.Sandboxes), recordsBefore)
	}
	if last, _ := e.Mgr.LastEventID(); last != lastBefore {
		t.Fatalf("event log moved from %d to %d during the flood", lastBefore, last)
	}
	if c := e.Routes.Len(); c != cachedBefore {
		t.Fatalf("route cache grew from %d to %d entries during the flood", cachedBefore, c)
	}
	if got := testutil.ToFloat64(preview.MetricRequests.WithLabelValues(preview.OutcomeNotFound)) - notFoundBefore; got < n {
		t.Fatalf("not_found counter grew by %v for %d requests", got, n)
	}
	if s := h.State(rec.ID); s != "running" {
		t.Fatalf("the one real sandbox is %s, want running", s)
	}
}

// reloadCaddyfile adapts src and loads it as a config reload of h's Caddy
// (same storage, so the same engine), then waits until the API is ready.
func (h *harness) reloadCaddyfile(src string) {
	h.T.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		h.T.Fatalf("adapting Caddyfile: %v\n%s", err, src)
	}
	for _, w := range warnings {
		h.T.Logf("caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		h.T.Fatalf("loading config: %v", err)
	}
	h.WaitReady()
}

// useT makes h report to t (a subtest) until the returned func is called.
func (h *harness) useT(t testing.TB) (restore func()) {
	prev := h.T
	h.T = t
	return func() { h.T = prev }
}
