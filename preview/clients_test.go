package preview_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
)

// getFrom sends an API-style GET (held through a wake) to a preview host
// from the loopback address src.
func (h *harness) getFrom(src, host, path string) (int, string, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", h.PreviewPort))
		},
		DisableKeepAlives: true,
	}}
	req, _ := http.NewRequest("GET", "http://"+host+path, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestPerClientBudgets: on the real engine, one client address that has
// spent its wake budget (wake_rate_per_client) gets 429 wake_rate_client
// while another address wakes the same sandbox; and a client may hold only
// max_held_per_client requests through a wake at once (429 too_many_held),
// while another client's request is held and answered.
func TestPerClientBudgets(t *testing.T) {
	h := newHarness(t, "wake_rate_per_client 0.01\n\t\tmax_held_per_client 1")
	s1, s2 := h.Create(nil), h.Create(nil)
	slow := h.Create(map[string]string{"STARTUP_DELAY": "3s"})
	for _, id := range []string{s1.ID, s2.ID, slow.ID} {
		h.Stop(id)
	}

	if code, body, err := h.getFrom("127.0.0.2", h.Host(s1.ID, 8080), "/healthz"); err != nil || code != 200 {
		t.Fatalf("first wake from 127.0.0.2: %d %q %v", code, body, err)
	}
	code, body, err := h.getFrom("127.0.0.2", h.Host(s2.ID, 8080), "/healthz")
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(body, "wake_rate_client") {
		t.Fatalf("second wake from 127.0.0.2 at once: %d %q %v, want 429 wake_rate_client", code, body, err)
	}
	if code, body, err := h.getFrom("127.0.0.3", h.Host(s2.ID, 8080), "/healthz"); err != nil || code != 200 {
		t.Fatalf("the same wake from 127.0.0.3: %d %q %v, want 200 (a budget of its own)", code, body, err)
	}

	// Held requests: 127.0.0.4 starts the slow wake and is held; its
	// second request, joining the wake, is one too many; 127.0.0.5's is
	// held and answered.
	first := make(chan error, 1)
	go func() {
		code, body, err := h.getFrom("127.0.0.4", h.Host(slow.ID, 8080), "/healthz")
		if err == nil && code != 200 {
			err = fmt.Errorf("%d %q", code, body)
		}
		first <- err
	}()
	e := currentEngine(t)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		_, waking := e.Mgr.Waking(slow.ID)
		return waking, "waiting for the slow wake to start"
	})
	code, body, err = h.getFrom("127.0.0.4", h.Host(slow.ID, 8080), "/healthz")
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(body, "too_many_held") {
		t.Fatalf("a second held request from 127.0.0.4: %d %q %v, want 429 too_many_held", code, body, err)
	}
	if code, body, err := h.getFrom("127.0.0.5", h.Host(slow.ID, 8080), "/healthz"); err != nil || code != 200 {
		t.Fatalf("a held request from 127.0.0.5: %d %q %v, want 200", code, body, err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first held request from 127.0.0.4: %v", err)
	}
	// Its place is free again.
	if code, body, err := h.getFrom("127.0.0.4", h.Host(slow.ID, 8080), "/healthz"); err != nil || code != 200 {
		t.Fatalf("127.0.0.4 once its held request was answered: %d %q %v", code, body, err)
	}
}
