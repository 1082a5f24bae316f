package preview_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/preview"
)

// TestServerTimingOfAHeldRequest: an API request held through the wake of
// a stopped sandbox carries where the cold start went (Server-Timing:
// hold, wake, admission, engine, ready), a request to the running sandbox
// none; the warming page's event stream gets the wake's phases after the
// running state.
func TestServerTimingOfAHeldRequest(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	resp, _ := h.Preview("GET", host, "/healthz", nil, http.Header{"Accept": {"application/json"}})
	if v := resp.Header.Get("Server-Timing"); resp.StatusCode != 200 || v != "" {
		t.Fatalf("a request to a running sandbox: %d, Server-Timing %q (want none)", resp.StatusCode, v)
	}
	h.Stop(rec.ID)

	// The page's stream, subscribed before the wake.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+host+preview.PathEvents, nil)
	stream, err := h.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	timing := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(data, "wake_timing") {
				var m map[string]any
				json.Unmarshal([]byte(data), &m)
				timing <- m
				return
			}
		}
	}()

	resp, body := h.Preview("GET", host, "/healthz", nil, http.Header{"Accept": {"application/json"}})
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("held request: %d %q", resp.StatusCode, body)
	}
	st := resp.Header.Get("Server-Timing")
	for _, phase := range []string{"hold", "wake", "admission", "engine", "ready"} {
		if !regexp.MustCompile(`(^|, )` + phase + `;dur=[0-9]+\.[0-9]`).MatchString(st) {
			t.Errorf("Server-Timing %q lacks %s", st, phase)
		}
	}
	select {
	case m := <-timing:
		if m["sandbox_id"] != rec.ID || m["engine_ms"] == nil || m["ready_ms"] == nil || m["wake_ms"].(float64) <= 0 {
			t.Errorf("the stream's timing: %v", m)
		}
	case <-ctx.Done():
		t.Fatal("no wake_timing message on the page's event stream")
	}
	resp, _ = h.Preview("GET", host, "/healthz", nil, http.Header{"Accept": {"application/json"}})
	if v := resp.Header.Get("Server-Timing"); v != "" {
		t.Errorf("after the wake, a request that did not wait carries %q", v)
	}
}
