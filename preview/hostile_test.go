package preview_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// rawExchange sends raw bytes to the preview port and reads one response.
func rawExchange(port int, raw string) (int, string, error) {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// TestHostileHostHeaders: Host headers built to confuse the host parser or
// what stands before it get a 4xx (sandwake's 404, or the 400 of Go's HTTP
// server), never wake the harness's sandbox, and leave the gateway serving.
// They are sent over raw TCP, since net/http refuses to send most of them.
// The table runs twice: with the harness's *.preview.localhost site, where
// Caddy answers hosts the site does not match itself (an empty 200: no
// route), and with a catch-all site, where every host reaches sandwake.
func TestHostileHostHeaders(t *testing.T) {
	h := newHarness(t, "")
	running := h.Create(nil)
	rec := h.Create(nil)
	h.Stop(rec.ID)
	since := time.Now()
	id, p := rec.ID, h.PreviewPort
	pct := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
		return b.String()
	}
	// 64 KiB is past Caddy's default 16 KiB header limit (431); 12 KiB is
	// not, so those reach the site matcher and sandwake's host parser.
	long, mid := strings.Repeat("a", 64<<10), strings.Repeat("a", 12<<10)
	tests := []struct {
		name string
		host string // everything after "Host: " up to the request's own CRLF
	}{
		{"64 KiB label", "s-" + long + "-8080.preview.localhost"},
		{"64 KiB host", long},
		{"64 KiB of labels", strings.Repeat("a.", 32<<10) + "preview.localhost"},
		{"64 KiB port", "s-a-80.preview.localhost:" + strings.Repeat("9", 64<<10)},
		{"12 KiB label", "s-" + mid + "-8080.preview.localhost"},
		{"12 KiB id before the real one", fmt.Sprintf("s-%s%s-8080.preview.localhost", mid, id)},
		{"12 KiB of labels", strings.Repeat("a.", 6<<10) + "preview.localhost"},
		{"12 KiB port", fmt.Sprintf("s-a-80.preview.localhost:%s", strings.Repeat("9", 12<<10))},
		{"NUL in id", fmt.Sprintf("s-%s\x00-8080.preview.localhost:%d", id, p)},
		{"NUL after host", fmt.Sprintf("s-%s-8080.preview.localhost\x00.evil", id)},
		{"NUL only", "\x00"},
		{"percent NUL", fmt.Sprintf("s-%s-8080.preview.localhost%%00", id)},
		{"unicode id", fmt.Sprintf("s-%sé-8080.preview.localhost:%d", id, p)},
		{"unicode dot", fmt.Sprintf("s-%s-8080.preview。localhost", id)},
		{"fullwidth digits", fmt.Sprintf("s-%s-８０８０.preview.localhost", id)},
		{"punycode id", "s-xn--caf-dma-8080.preview.localhost"},
		{"punycode preview", fmt.Sprintf("s-%s-8080.xn--prview-bva.localhost", id)},
		{"double dot before domain", fmt.Sprintf("s-%s-8080.preview..localhost", id)},
		{"double dot before preview", fmt.Sprintf("s-%s-8080..preview.localhost", id)},
		{"dot dot", ".."},
		{"dot dot label", fmt.Sprintf("../s-%s-8080.preview.localhost", id)},
		{"trailing dots", fmt.Sprintf("s-%s-8080.preview.localhost..", id)},
		{"port out of range", "s-a-80.preview.localhost:99999"},
		{"userinfo", "s-a-80.preview.localhost@evil"},
		{"userinfo on real id", fmt.Sprintf("s-%s-8080.preview.localhost@evil", id)},
		{"userinfo before", fmt.Sprintf("evil@s-%s-8080.preview.localhost", id)},
		{"ipv6 loopback", "[::1]"},
		{"ipv6 with port", fmt.Sprintf("[::1]:%d", p)},
		{"ipv6 unclosed", fmt.Sprintf("[s-%s-8080.preview.localhost", id)},
		{"percent-encoded id", "s-%61-80.preview.localhost"},
		{"percent-encoded real id", fmt.Sprintf("s-%s-8080.preview.localhost", pct(id))},
		{"empty", ""},
		{"space inside", fmt.Sprintf("s-%s-8080.preview.localhost evil", id)},
		{"bare CR", fmt.Sprintf("s-%s-8080.preview.localhost\rX-Injected: 1", id)},
		{"bare LF header injection", "s-a-80.preview.localhost\nX-Injected: 1"},
		{"CRLF second request", "s-a-80.preview.localhost\r\n\r\nGET /admin HTTP/1.1\r\nHost: evil"},
		{"obs-fold", fmt.Sprintf("evil\r\n s-%s-8080.preview.localhost", id)},
		{"two Host headers", fmt.Sprintf("s-%s-8080.preview.localhost\r\nHost: s-%s-8080.preview.localhost", id, id)},
	}
	check := func(t *testing.T, catchAll bool) {
		defer h.useT(t)()
		answers := map[string][]string{}
		defer func() { t.Logf("answers: %v", answers) }()
		for _, tt := range tests {
			raw := "GET /healthz HTTP/1.1\r\nHost: " + tt.host + "\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
			status, body, err := rawExchange(p, raw)
			answers[fmt.Sprint(status)] = append(answers[fmt.Sprint(status)], tt.name)
			switch {
			case err != nil:
				t.Errorf("%s: no response: %v", tt.name, err)
			case status >= 400 && status < 500:
			case !catchAll && status == http.StatusOK && body == "":
				// Caddy's own answer to a host no site matches.
			default:
				t.Errorf("%s: %d %.200q, want a 4xx", tt.name, status, body)
			}
			if status == http.StatusOK && strings.Contains(body, "ok") {
				t.Errorf("%s: served by the app", tt.name)
			}
		}
		// The gateway keeps serving.
		resp, body := h.Preview("GET", h.Host(running.ID, 8080), "/healthz", nil, gatewaytest.APIHeader())
		if resp.StatusCode != http.StatusOK || body != "ok\n" {
			t.Fatalf("after the hostile hosts: %d %.200q, want the app's 200", resp.StatusCode, body)
		}
	}
	t.Run("preview site", func(t *testing.T) { check(t, false) })
	h.reloadCaddyfile(strings.Replace(h.Caddyfile(""),
		fmt.Sprintf("http://*.preview.localhost:%d {", p), fmt.Sprintf("http://:%d {", p), 1))
	t.Run("catch-all site", func(t *testing.T) { check(t, true) })

	if s := h.State(rec.ID); s != "stopped" {
		t.Fatalf("hostile hosts woke the sandbox: %s", s)
	}
	if n := h.StartEvents(rec.ID, since); n != 0 {
		t.Fatalf("hostile hosts caused %d docker starts", n)
	}
}
