package preview_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestNoInflationOnTheClientsBehalf: on the real engine through real
// Caddy, an answer reaches the client in the encoding the app sent for the
// client's own Accept-Encoding. A client that names no encoding is passed
// on asking for identity (the gate says so, whatever the transport: the
// app answers it identity), and an app
// that sends gzip unasked reaches it as the ~1 MiB of gzip it sent, never
// inflated (to 1 GiB) on the gateway's CPU; a client that asks for gzip
// gets the gzip bytes.
func TestNoInflationOnTheClientsBehalf(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	// DisableCompression: the client itself adds no Accept-Encoding and
	// inflates nothing, so that what arrives is what the gateway sent.
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DisableCompression: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", h.PreviewPort))
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	const limit = 8 << 20 // a body beyond this was inflated: stop reading
	get := func(path, acceptEncoding string) (*http.Response, []byte, bool) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+host+path, nil)
		if acceptEncoding != "" {
			req.Header.Set("Accept-Encoding", acceptEncoding)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			t.Fatalf("GET %s: reading: %v", path, err)
		}
		return resp, body, len(body) > limit
	}
	// The gzip the app sends for 1024 MiB of zeros: 1024 members of about
	// 1 KiB each.
	isGzipMiB := func(body []byte) bool {
		return len(body) > 512<<10 && len(body) < 2<<20 && bytes.HasPrefix(body, []byte{0x1f, 0x8b})
	}

	resp, body, inflated := get("/gzip?mb=1024", "")
	if inflated || resp.StatusCode != 200 || resp.Header.Get("X-Seen-Accept-Encoding") != "identity" || resp.Header.Get("Content-Encoding") != "" ||
		string(body) != "identity: no gzip was asked for\n" {
		t.Fatalf("no Accept-Encoding: %d, the app saw Accept-Encoding %q, Content-Encoding %q, %d bytes (inflated: %v); want the app's identity answer to a request asking for no encoding",
			resp.StatusCode, resp.Header.Get("X-Seen-Accept-Encoding"), resp.Header.Get("Content-Encoding"), len(body), inflated)
	}

	resp, body, inflated = get("/gzip?mb=1024&always=1", "")
	if inflated || resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" || !isGzipMiB(body) {
		t.Fatalf("no Accept-Encoding, gzip sent anyway: %d, Content-Encoding %q, %d bytes (inflated: %v); want the ~1 MiB of gzip the app sent",
			resp.StatusCode, resp.Header.Get("Content-Encoding"), len(body), inflated)
	}

	for _, ae := range []string{"gzip", "gzip, deflate, br"} {
		resp, body, inflated = get("/gzip?mb=1024", ae)
		if inflated || resp.StatusCode != 200 || resp.Header.Get("X-Seen-Accept-Encoding") != ae || resp.Header.Get("Content-Encoding") != "gzip" || !isGzipMiB(body) {
			t.Fatalf("Accept-Encoding %q: %d, the app saw %q, Content-Encoding %q, %d bytes (inflated: %v); want the app's gzip as sent",
				ae, resp.StatusCode, resp.Header.Get("X-Seen-Accept-Encoding"), resp.Header.Get("Content-Encoding"), len(body), inflated)
		}
	}
}
