package lifecycle_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestWebhookRedirectIsNotFollowed: a receiver answering 307 (which would
// re-send the body and its signature) gets the delivery marked failed and
// retried; the place it points to gets nothing. The logs of the failures
// show the webhook URL's scheme and host, never its path (where receivers
// such as Slack's keep their secret).
func TestWebhookRedirectIsNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer target.Close()
	var attempts atomic.Int32
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		http.Redirect(w, r, target.URL+"/collect", http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()

	core, logs := observer.New(zap.DebugLevel)
	var mu sync.Mutex
	var results []lifecycle.DeliveryResult
	e := newTestEnv(t, lifecycle.Config{Logger: zap.New(core), OnDelivery: func(r lifecycle.DeliveryResult) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	}})
	const secretPath = "/services/T000/B000/sekret-in-the-path"
	e.m.SetWebhooks([]lifecycle.Webhook{{URL: redirector.URL + secretPath, Secret: []byte("whsec"), RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond}})
	if _, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "hook1", Spec: lifecycle.SampleSpec()}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 3, "waiting for three delivery attempts"
	})
	mu.Lock()
	for _, r := range results {
		if r.Err == nil || !strings.Contains(r.Err.Error(), "307") || !strings.Contains(r.Err.Error(), "not followed") {
			t.Errorf("delivery to a redirecting receiver: %v, want a failure naming the redirect", r.Err)
		}
	}
	mu.Unlock()
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect's target got %d requests, want none", n)
	}
	if attempts.Load() < 3 {
		t.Fatalf("%d attempts at the receiver, want retries", attempts.Load())
	}
	shown := 0
	for _, entry := range logs.All() {
		line := entry.Message
		for _, f := range entry.Context {
			line += " " + f.Key + "=" + f.String
			if f.Interface != nil {
				if err, ok := f.Interface.(error); ok {
					line += " " + err.Error()
				}
			}
		}
		if strings.Contains(line, "sekret") {
			t.Fatalf("a log line shows the webhook URL's path: %s", line)
		}
		if strings.Contains(line, "url="+redirector.URL+"/…") {
			shown++
		}
	}
	if shown == 0 {
		t.Fatalf("no log line names the webhook by scheme and host; logs: %v", logs.All())
	}
}

// TestRedactURL: scheme and host only.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/xyz": "https://hooks.slack.com/…",
		"http://127.0.0.1:9000/hook?token=abc":       "http://127.0.0.1:9000/…",
		"https://user:pass@example.com/":             "https://example.com/…",
		"not a url":                                  "(webhook URL)",
	} {
		if got := lifecycle.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
