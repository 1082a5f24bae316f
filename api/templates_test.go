package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestTemplatesAPI: through a real gateway, GET /v1/templates shows the
// pool filling; a create from the template claims a pool container and
// the sandbox answers on its preview host; container-shaping fields and
// unknown templates are 400s naming them; pool containers are never listed
// as sandboxes.
func TestTemplatesAPI(t *testing.T) {
	h := newHarness(t, fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t\tmemory_mb 64\n\t\t\tpool {\n\t\t\t\tmin_idle 1\n\t\t\t}\n\t\t}",
		testenv.TestAppImage(t)))
	var list client.TemplateList
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		h.API("GET", "/v1/templates", nil, &list)
		return len(list.Templates) == 1 && list.Templates[0].Pool.Idle == 1, fmt.Sprintf("%+v", list)
	})
	tm := list.Templates[0]
	if tm.Name != "web" || tm.Image != h.Image || tm.MemoryMB != 64 || tm.Pool.MinIdle != 1 || tm.Pool.MaxIdle != 1 || tm.Pool.State != "paused" {
		t.Fatalf("template: %+v", tm)
	}
	var sbs client.SandboxList
	if h.API("GET", "/v1/sandboxes", nil, &sbs); len(sbs.Sandboxes) != 0 {
		t.Fatalf("a pool container is listed as a sandbox: %+v", sbs.Sandboxes)
	}
	var rec client.Sandbox
	status, hdr := apiHeader(t, h.Harness, "POST", "/v1/sandboxes", map[string]any{"template": "web", "labels": map[string]string{"app": "a"}}, &rec)
	if status != http.StatusCreated {
		t.Fatalf("create from template: %d %+v", status, rec)
	}
	if st := hdr.Get("Server-Timing"); !strings.Contains(st, `pool;desc="hit"`) || !strings.Contains(st, "create;dur=") {
		t.Errorf("a pool hit's Server-Timing: %q", st)
	}
	if rec.Pool == nil || !rec.Pool.Hit || rec.Template != "web" || rec.State != "running" || rec.Labels["app"] != "a" {
		t.Fatalf("create from a full pool: %+v (pool %+v)", rec, rec.Pool)
	}
	resp, body := h.Preview("GET", h.Host(rec.ID, 8080), "/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("claimed sandbox's preview: %d %q", resp.StatusCode, body)
	}
	var e client.ErrorResponse
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"template": "web", "image": "other:1"}, &e); status != 400 ||
		!strings.Contains(e.Error.Message, "image") || !strings.Contains(e.Error.Message, "bypass") {
		t.Fatalf("image beside a template: %d %+v", status, e)
	}
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"template": "nope"}, &e); status != 400 || !strings.Contains(e.Error.Message, "templates: web") {
		t.Fatalf("unknown template: %d %+v", status, e)
	}
	var cold client.Sandbox
	status, hdr = apiHeader(t, h.Harness, "POST", "/v1/sandboxes", map[string]any{"template": "web", "pool": "bypass"}, &cold)
	if status != http.StatusCreated || cold.Pool == nil || cold.Pool.Hit || cold.Pool.Reason != "bypass" {
		t.Fatalf("bypass: %d %+v", status, cold.Pool)
	}
	if st := hdr.Get("Server-Timing"); !strings.Contains(st, `pool;desc="miss bypass"`) {
		t.Errorf("a pool miss's Server-Timing: %q", st)
	}
	if h.API("GET", "/v1/sandboxes", nil, &sbs); len(sbs.Sandboxes) != 2 {
		t.Fatalf("listed %d sandboxes, want the 2 created", len(sbs.Sandboxes))
	}
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		h.API("GET", "/v1/templates", nil, &list)
		p := list.Templates[0].Pool
		return p.Idle == 1 && p.Hits == 1 && p.Misses == 1 && p.MissReasons["bypass"] == 1, fmt.Sprintf("%+v", p)
	})

}

// TestDashboardTemplatesInBrowser: the dashboard lists the templates with
// their pools, and an admin creates a sandbox from one with a click: it is
// claimed from the pool and appears among the sandboxes.
func TestDashboardTemplatesInBrowser(t *testing.T) {
	h := newHarness(t, fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t\tmemory_mb 64\n\t\t\tpool {\n\t\t\t\tmin_idle 1\n\t\t\t}\n\t\t}",
		testenv.TestAppImage(t)))
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var list client.TemplateList
		h.API("GET", "/v1/templates", nil, &list)
		return len(list.Templates) == 1 && list.Templates[0].Pool.Idle == 1, fmt.Sprintf("%+v", list)
	})
	srv := newDashboardServer(t, h, true)
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	gatewaytest.Browse(t, ctx, "signing in and seeing the templates",
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(chromedp.CSS(`#templates li[data-template="web"] .pool[data-idle="1"]`)),
	)
	text := gatewaytest.Evaluate[string](t, ctx, `document.querySelector('#templates li[data-template="web"]').textContent`)
	if !strings.Contains(text, "pool 1/1 idle (paused)") || !strings.Contains(text, "0 hits") || !strings.Contains(text, h.Image) {
		t.Fatalf("template line: %q", text)
	}
	gatewaytest.Browse(t, ctx, "creating from the template",
		chromedp.Click(chromedp.CSS(`#templates button[data-template="web"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#rows tr td.state[data-state="running"]`)),
	)
	msg := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("message-text").textContent`)
	if !regexp.MustCompile(`^Created [0-9a-z]+ from the web pool\.$`).MatchString(msg) {
		t.Fatalf("message after the create: %q", msg)
	}
	var sbs client.SandboxList
	if h.API("GET", "/v1/sandboxes", nil, &sbs); len(sbs.Sandboxes) != 1 || sbs.Sandboxes[0].Template != "web" || !strings.Contains(msg, sbs.Sandboxes[0].ID) {
		t.Fatalf("sandboxes after the click: %+v", sbs.Sandboxes)
	}
	gatewaytest.Screenshot(t, ctx, "dashboard-templates.png")
}

// apiHeader is h.API that also returns the answer's header.
func apiHeader(t *testing.T, h *gatewaytest.Harness, method, path string, body, out any) (int, http.Header) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, h.APIURL(path), bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header
}
