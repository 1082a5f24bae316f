package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// TestDashboardServicesInBrowser: on the real engine, a group's row shows
// its members as badges with their states under the image, without
// widening the table; a service that never becomes ready shows as failed
// with what happened (its sandbox.service_failed event), and a stop shows
// the members stopped.
func TestDashboardServicesInBrowser(t *testing.T) {
	h := newHarness(t, "wake_timeout 4s")
	var rec swclient.Sandbox
	status, id := h.createRaw(map[string]any{"services": map[string]any{
		"db":    map[string]any{"image": h.Image, "env": map[string]string{"PORT": "5432"}, "ready": "http:5432/healthz", "memory_mb": 64},
		"cache": map[string]any{"image": h.Image, "env": map[string]string{"PORT": "6379"}, "ready": "tcp:6379"},
	}}, &rec)
	if status != http.StatusCreated {
		t.Fatalf("create with services: %d %+v", status, rec)
	}
	srv := newDashboardServer(t, h, true)
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	gatewaytest.Browse(t, ctx, "signing in and seeing the group",
		chromedp.EmulateViewport(1280, 800),
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(rowSel(id, `.services .member[data-service="db"][data-state="running"]`)),
		chromedp.WaitVisible(rowSel(id, `.services .member[data-service="cache"][data-state="running"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#live[data-status="live"]`)),
	)
	type facts struct {
		Text, Title string
		Overflow    float64
	}
	f := gatewaytest.Evaluate[facts](t, ctx, fmt.Sprintf(`(function () {
		var box = document.querySelector('tr[data-id=%q] .services'), wrap = document.querySelector(".table-wrap");
		return { Text: box.textContent, Title: box.title, Overflow: wrap.scrollWidth - wrap.clientWidth };
	})()`, id))
	if f.Text != "cache runningdb running" || !strings.Contains(f.Title, "db: running · "+h.Image+" · 64 MiB · ready http:5432/healthz") ||
		!strings.Contains(f.Title, "group memory") {
		t.Errorf("members %q, title %q", f.Text, f.Title)
	}
	if f.Overflow > 0 {
		t.Errorf("the table is %.0f px wider than its card", f.Overflow)
	}
	gatewaytest.Screenshot(t, ctx, "dashboard-services.png")

	// A group whose service never listens: its create fails, and the
	// row shows which member and why.
	var e swclient.ErrorResponse
	status, bad := h.createRaw(map[string]any{"services": map[string]any{
		"db": map[string]any{"image": h.Image, "env": map[string]string{"PORT": "5432"}, "ready": "tcp:5999"},
	}}, &e)
	if status < 400 || !strings.Contains(e.Error.Message, "db") {
		t.Fatalf("create with a service that is never ready: %d %+v", status, e)
	}
	gatewaytest.Browse(t, ctx, "seeing the failed service",
		chromedp.WaitVisible(rowSel(bad, `.services .member[data-service="db"][data-state="failed"]`)),
		chromedp.WaitVisible(rowSel(bad, `td.state[data-state="error"]`)),
	)
	title := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q] .member[data-service="db"]').title`, bad))
	if !strings.Contains(title, "db: failed") || !strings.Contains(title, "· db: ") {
		t.Errorf("failed member's title %q, want the event's reason", title)
	}

	h.Stop(id)
	gatewaytest.Browse(t, ctx, "seeing the group stopped",
		chromedp.WaitVisible(rowSel(id, `.services .member[data-service="db"][data-state="stopped"]`)),
		chromedp.WaitVisible(rowSel(id, `.services .member[data-service="cache"][data-state="stopped"]`)),
	)
}
