package preview_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/preview"
)

// streamFrom opens a preview host's event stream from the loopback address
// src (127.0.0.x: every one of them is this machine) and, when it is
// admitted, reads its first message. The caller closes the body.
func (h *harness) streamFrom(t *testing.T, src, host string) (*http.Response, string) {
	t.Helper()
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", h.PreviewPort))
		},
		DisableKeepAlives: true,
	}}
	resp, err := c.Get("http://" + host + preview.PathEvents)
	if err != nil {
		t.Fatalf("event stream from %s: %v", src, err)
	}
	if resp.StatusCode != http.StatusOK {
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		resp.Body.Close()
		return resp, b.String()
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			return resp, line
		}
	}
	t.Fatalf("event stream from %s ended before its first message: %v", src, sc.Err())
	return nil, ""
}

// TestEventStreamCaps: the preview hosts' event streams, open to anyone, are
// capped per client address (429) and overall (503), both with Retry-After
// and a JSON body; a stream's slot is freed when its client goes away; and
// with every slot taken the warming page still works (it falls back to its
// meta refresh and the status endpoint).
func TestEventStreamCaps(t *testing.T) {
	h := newHarness(t, "max_event_streams 3\n\t\tmax_event_streams_per_client 2")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	e := currentEngine(t)
	open := func() int {
		n, _ := e.Streams.Open(netip.Prefix{})
		return n
	}

	a1, first := h.streamFrom(t, "127.0.0.1", host)
	if a1.StatusCode != http.StatusOK || !strings.Contains(first, `"to":"running"`) {
		t.Fatalf("first stream: %d %q", a1.StatusCode, first)
	}
	defer a1.Body.Close()
	a2, _ := h.streamFrom(t, "127.0.0.1", host)
	defer a2.Body.Close()
	if a2.StatusCode != http.StatusOK {
		t.Fatalf("second stream of one client: %d", a2.StatusCode)
	}
	refusal := func(resp *http.Response, body string, status int, code string) {
		t.Helper()
		got, _ := jsonErrorCode(body)
		if resp.StatusCode != status || got != code || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("refused stream: %d %v %q; want %d %s with Retry-After", resp.StatusCode, resp.Header, body, status, code)
		}
	}
	resp, body := h.streamFrom(t, "127.0.0.1", host)
	refusal(resp, body, http.StatusTooManyRequests, "too_many_streams")

	b1, _ := h.streamFrom(t, "127.0.0.2", host)
	defer b1.Body.Close()
	if b1.StatusCode != http.StatusOK {
		t.Fatalf("another client's stream: %d", b1.StatusCode)
	}
	resp, body = h.streamFrom(t, "127.0.0.3", host)
	refusal(resp, body, http.StatusServiceUnavailable, "streams_full")
	if n := open(); n != 3 {
		t.Errorf("%d streams counted open, want 3", n)
	}

	// With every slot taken, a sleeping sandbox's page still warms: it is
	// served, refreshes by itself without a stream, and its status answers.
	h.Stop(rec.ID)
	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusServiceUnavailable || pageKind(body) != preview.PageWarming || resp.Header.Get("Retry-After") == "" ||
		!regexp.MustCompile(`<noscript><meta http-equiv="refresh" content="\d+"></noscript>`).MatchString(body) {
		t.Errorf("warming page with the streams full: %d kind %q %v", resp.StatusCode, pageKind(body), resp.Header)
	}
	if resp, body = h.Preview("GET", host, preview.PathStatus, nil, gatewaytest.APIHeader()); resp.StatusCode != http.StatusOK {
		t.Errorf("status with the streams full: %d %s", resp.StatusCode, body)
	}

	// A client that goes away frees its slot for the next one.
	a1.Body.Close()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return open() == 2, fmt.Sprintf("%d streams open", open())
	})
	a3, _ := h.streamFrom(t, "127.0.0.1", host)
	defer a3.Body.Close()
	if a3.StatusCode != http.StatusOK {
		t.Errorf("stream after one closed: %d, want 200", a3.StatusCode)
	}
	for _, r := range []*http.Response{a2, a3, b1} {
		r.Body.Close()
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return open() == 0, fmt.Sprintf("%d streams open after every client left", open())
	})
}
