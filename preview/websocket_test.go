package preview_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

func TestWebsocketWakesAndCountsAsActive(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	h.Stop(rec.ID)
	since := time.Now()

	openConns := func() int64 {
		t.Helper()
		var v client.Sandbox
		if status := h.API("GET", "/v1/sandboxes/"+rec.ID, nil, &v); status != http.StatusOK {
			t.Fatalf("GET sandbox: %d", status)
		}
		return v.OpenConnections
	}

	// The upgrade to a stopped sandbox is held through the wake, then
	// proxied: the dial succeeds with no retry of ours.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := "ws://" + h.Host(rec.ID, 8080) + "/ws"
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: h.Client})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dialling %s: %v (status %d)", url, err, status)
	}
	t.Cleanup(func() { c.CloseNow() })
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %d", resp.StatusCode)
	}
	if s := h.State(rec.ID); s != "running" {
		t.Fatalf("after the upgrade the sandbox is %s", s)
	}

	echo := func(msg string) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("writing %q: %v", msg, err)
		}
		typ, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading echo of %q: %v", msg, err)
		}
		if typ != websocket.MessageText || string(got) != msg {
			t.Fatalf("echo: %v %q, want text %q", typ, got, msg)
		}
	}
	echo("hello " + rec.ID)

	// An open websocket is an open connection of the sandbox.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n := openConns()
		return n == 1, fmt.Sprintf("open_connections = %d, want 1", n)
	})
	echo("still there")
	if n := openConns(); n != 1 {
		t.Fatalf("open_connections = %d while the websocket is open, want 1", n)
	}

	if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("closing: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n := openConns()
		return n == 0, fmt.Sprintf("open_connections = %d after close, want 0", n)
	})
	if n := h.StartEvents(rec.ID, since); n != 1 {
		t.Fatalf("%d docker starts, want exactly 1", n)
	}
}
