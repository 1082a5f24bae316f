package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/webhook"
)

// receiver is a webhook endpoint on loopback that records what it accepts.
type receiver struct {
	srv    *httptest.Server
	secret []byte

	mu       sync.Mutex
	fail     int // answer 500 to this many more requests
	attempts int
	got      []delivery // accepted (answered 200), in arrival order
}

type delivery struct {
	id        string
	signature string
	body      []byte
	event     lifecycle.Event
}

func newReceiver(t *testing.T, secret string, fail int) *receiver {
	rc := &receiver{secret: []byte(secret), fail: fail}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.attempts++
		if rc.fail > 0 {
			rc.fail--
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		if err := webhook.Verify(rc.secret, r.Header.Get(webhook.HeaderSignature), body, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev lifecycle.Event
		json.Unmarshal(body, &ev)
		rc.got = append(rc.got, delivery{id: r.Header.Get(webhook.HeaderDelivery), signature: r.Header.Get(webhook.HeaderSignature), body: body, event: ev})
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// forSandbox returns the accepted deliveries of one sandbox.
func (rc *receiver) forSandbox(id string) []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []delivery
	for _, d := range rc.got {
		if d.event.SandboxID == id {
			out = append(out, d)
		}
	}
	return out
}

func types(ds []delivery) string {
	var t []string
	for _, d := range ds {
		t = append(t, d.event.Type)
	}
	return strings.Join(t, " ")
}

func webhookOption(url, secret string) string {
	return fmt.Sprintf("webhook %s {\n\t\t\tsecret %s\n\t\t\tretry_min 50ms\n\t\t}", url, secret)
}

func TestWebhooksDeliverEveryTransitionOnce(t *testing.T) {
	rc := newReceiver(t, "whsec-test", 0)
	h := newHarness(t, webhookOption(rc.srv.URL, "whsec-test"))
	rec := h.Create(nil)
	for _, op := range []string{"pause", "wake", "stop"} {
		if code := h.API("POST", "/v1/sandboxes/"+rec.ID+"/"+op, nil, nil); code != 200 {
			t.Fatalf("%s: %d", op, code)
		}
	}
	if code := h.API("DELETE", "/v1/sandboxes/"+rec.ID, nil, nil); code != 204 {
		t.Fatalf("destroy: %d", code)
	}
	want := "sandbox.creating sandbox.running sandbox.paused sandbox.running sandbox.stopped sandbox.destroyed"
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		got := types(rc.forSandbox(rec.ID))
		return got == want, got
	})
	ds := rc.forSandbox(rec.ID)
	seen := map[string]bool{}
	for i, d := range ds {
		if seen[d.id] {
			t.Fatalf("delivery %s received twice", d.id)
		}
		seen[d.id] = true
		if d.id != strconv.FormatUint(d.event.ID, 10) {
			t.Fatalf("delivery id %s for event %d", d.id, d.event.ID)
		}
		if i > 0 && d.event.ID <= ds[i-1].event.ID {
			t.Fatalf("out of order: %d after %d", d.event.ID, ds[i-1].event.ID)
		}
	}
	// A receiver's checks: the real signature verifies; a tampered body or
	// an old timestamp does not.
	d := ds[0]
	if err := webhook.Verify([]byte("whsec-test"), d.signature, d.body, time.Minute); err != nil {
		t.Fatalf("valid delivery: %v", err)
	}
	tampered := []byte(strings.Replace(string(d.body), "creating", "running", 1))
	if err := webhook.Verify([]byte("whsec-test"), d.signature, tampered, time.Minute); !errors.Is(err, webhook.ErrMismatch) {
		t.Fatalf("tampered body: %v", err)
	}
	if err := webhook.VerifyAt([]byte("whsec-test"), d.signature, d.body, time.Minute, time.Now().Add(time.Hour)); !errors.Is(err, webhook.ErrTooOld) {
		t.Fatalf("old timestamp: %v", err)
	}
}

func TestWebhookRetriesKeepOrder(t *testing.T) {
	rc := newReceiver(t, "whsec-retry", 6) // the first 6 attempts fail
	h := newHarness(t, webhookOption(rc.srv.URL, "whsec-retry"))
	rec := h.Create(nil)
	h.API("POST", "/v1/sandboxes/"+rec.ID+"/pause", nil, nil)
	h.Stop(rec.ID)
	want := "sandbox.creating sandbox.running sandbox.paused sandbox.stopped"
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		got := types(rc.forSandbox(rec.ID))
		return got == want, got
	})
	rc.mu.Lock()
	attempts := rc.attempts
	rc.mu.Unlock()
	if attempts < 6+4 {
		t.Fatalf("%d attempts: the failures were not retried", attempts)
	}
}

// sseClient reads /v1/events.
type sseClient struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func (h *harness) events(t *testing.T, query, lastID string) *sseClient {
	t.Helper()
	req, _ := http.NewRequest("GET", h.APIURL("/v1/events"+query), nil)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", err, resp)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sseClient{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next reads the next event (skipping comments), failing after timeout.
func (c *sseClient) next(t *testing.T, timeout time.Duration) lifecycle.Event {
	t.Helper()
	type result struct {
		ev  lifecycle.Event
		err error
	}
	ch := make(chan result, 1)
	go func() {
		for c.sc.Scan() {
			line := c.sc.Text()
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var ev lifecycle.Event
				err := json.Unmarshal([]byte(data), &ev)
				ch <- result{ev, err}
				return
			}
		}
		ch <- result{err: fmt.Errorf("stream ended: %v", c.sc.Err())}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.ev
	case <-time.After(timeout):
		c.resp.Body.Close()
		t.Fatalf("no event within %s", timeout)
	}
	return lifecycle.Event{}
}

func TestEventStreamResumesExactly(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	// A client that never reads must not hold anything up.
	stalled := h.events(t, "", "")

	c := h.events(t, "?sandbox="+rec.ID, "")
	h.API("POST", "/v1/sandboxes/"+rec.ID+"/pause", nil, nil)
	first := c.next(t, 10*time.Second)
	if first.Type != "sandbox.paused" || first.SandboxID != rec.ID {
		t.Fatalf("first event %+v", first)
	}
	c.resp.Body.Close() // disconnect

	// Missed while away: wake, stop, wake.
	for _, op := range []string{"wake", "stop", "wake"} {
		if code := h.API("POST", "/v1/sandboxes/"+rec.ID+"/"+op, nil, nil); code != 200 {
			t.Fatalf("%s: %d", op, code)
		}
	}
	var hist struct{ Events []lifecycle.Event }
	h.API("GET", "/v1/sandboxes/"+rec.ID+"/history", nil, &hist)
	var missed []lifecycle.Event
	for _, ev := range hist.Events {
		if ev.ID > first.ID {
			missed = append(missed, ev)
		}
	}
	if len(missed) != 3 {
		t.Fatalf("history after %d: %+v", first.ID, missed)
	}
	c2 := h.events(t, "?sandbox="+rec.ID, strconv.FormatUint(first.ID, 10))
	for i, want := range missed {
		got := c2.next(t, 10*time.Second)
		if got.ID != want.ID || got.Type != want.Type {
			t.Fatalf("resumed event %d = %d %s, want %d %s", i, got.ID, got.Type, want.ID, want.Type)
		}
	}
	// Then live, with nothing repeated.
	h.Stop(rec.ID)
	if live := c2.next(t, 10*time.Second); live.Type != "sandbox.stopped" || live.ID <= missed[2].ID {
		t.Fatalf("live event %+v", live)
	}
	// The stalled client's connection is still open and nothing waited
	// for it: every transition above completed.
	if stalled.resp.Close {
		t.Fatal("stalled stream closed")
	}
}
