package preview_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// inflight asks the app of sandbox id, straight at its own address (not
// through the gateway, whose slots it would need), how many /wait requests
// it serves now and the most it ever served at once.
func (h *harness) inflight(id string) (now, most int) {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rec client.Sandbox
	if code := h.API("GET", "/v1/sandboxes/"+id, nil, &rec); code != 200 || rec.Address == "" {
		h.T.Fatalf("sandbox %s: %d, address %q", id, code, rec.Address)
	}
	addr := net.JoinHostPort(rec.Address, "8080")
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/inflight", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if _, err := fmt.Sscan(string(b), &now, &most); err != nil {
		h.T.Fatalf("inflight %q: %v", b, err)
	}
	return now, most
}

// TestWakeStormReleasedWithinSlots: a storm held through a wake reaches the
// app at most max_open_per_sandbox at a time, every request answered by the
// app (a bound that did not hold, or lost a request, fails it).
func TestWakeStormReleasedWithinSlots(t *testing.T) {
	const slots, n = 4, 120
	h := newHarness(t, fmt.Sprintf("max_open_per_sandbox %d", slots))
	rec := h.Create(map[string]string{"STARTUP_DELAY": "100ms"})
	host := h.Host(rec.ID, 8080)
	h.Stop(rec.ID)
	since := time.Now()

	var wg sync.WaitGroup
	bad := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := h.PreviewErr("GET", host, "/wait?ms=20", nil, http.Header{"Accept": {"application/json"}})
			switch {
			case err != nil:
				bad <- err.Error()
			case resp.StatusCode != 200 || body != "waited\n":
				bad <- fmt.Sprintf("request %d: %d %.120q", i, resp.StatusCode, body)
			}
		}()
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error(b)
	}
	if starts := h.StartEvents(rec.ID, since); starts != 1 {
		t.Errorf("%d docker starts, want 1", starts)
	}
	now, most := h.inflight(rec.ID)
	if most > slots || most < 1 || now != 0 {
		t.Fatalf("the app served up to %d requests at once (now %d); max_open_per_sandbox is %d", most, now, slots)
	}
}

// TestSlotsFullAnswersBusy: while a sandbox has max_open_per_sandbox long
// exchanges open, another request waits its turn up to hold_timeout, then
// gets 503 busy; once they end, requests go through again.
func TestSlotsFullAnswersBusy(t *testing.T) {
	const slots = 2
	h := newHarness(t, fmt.Sprintf("max_open_per_sandbox %d\n\t\thold_timeout 1s", slots))
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)

	var wg sync.WaitGroup
	long := make(chan string, slots)
	for range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := h.PreviewErr("GET", host, "/wait?ms=4000", nil, nil)
			if err != nil {
				long <- err.Error()
			} else if resp.StatusCode != 200 {
				long <- fmt.Sprintf("long request: %d %.120q", resp.StatusCode, body)
			}
		}()
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		now, _ := h.inflight(rec.ID)
		return now == slots, fmt.Sprintf("%d long requests at the app", now)
	})
	resp, body := h.Preview("GET", host, "/healthz", nil, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"busy"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request past the slots: %d %v %.200q", resp.StatusCode, resp.Header, body)
	}
	wg.Wait()
	close(long)
	for b := range long {
		t.Error(b)
	}
	resp, body = h.Preview("GET", host, "/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("after the slots were released: %d %.200q", resp.StatusCode, body)
	}
}

// TestWebsocketsTakeNoSlot: websockets are tunnels, not requests to pace:
// more of them than max_open_per_sandbox stay open and echo, and a plain
// request still goes through at once (a websocket holding a slot for its
// life would leave the third dial, then every request, 503 busy).
func TestWebsocketsTakeNoSlot(t *testing.T) {
	const slots, sockets = 2, 5
	h := newHarness(t, fmt.Sprintf("max_open_per_sandbox %d\n\t\thold_timeout 1s", slots))
	rec := h.Create(nil)
	url := "ws://" + h.Host(rec.ID, 8080) + "/ws"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []*websocket.Conn
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	for i := range sockets {
		c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: h.Client})
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			t.Fatalf("websocket %d of %d (max_open_per_sandbox %d): %v (status %d)", i+1, sockets, slots, err, status)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		msg := fmt.Sprintf("socket %d", i)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("writing on %s: %v", msg, err)
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("echo on %s: %q, %v", msg, got, err)
		}
	}
	resp, body := h.Preview("GET", h.Host(rec.ID, 8080), "/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("a request beside %d websockets: %d %.200q", sockets, resp.StatusCode, body)
	}
}
