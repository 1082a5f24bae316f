package preview_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
	"github.com/sandwake/sandwake/preview"
)

// TestRequestsJoinRecreateInFlight: a killed sandbox (its container removed
// behind sandwake's back) is woken through the wake endpoint, whose answer
// says the wake is in flight. Plain requests meanwhile join that wake rather
// than being told the sandbox is killed: API clients are held and answered
// by the app, browsers get the warming page (or the app, once it runs), and
// the container is recreated and started once.
func TestRequestsJoinRecreateInFlight(t *testing.T) {
	h := newHarness(t, "wake_timeout 60s")
	// The app takes a while to listen, so the recreate stays in flight
	// while the requests below arrive.
	rec := h.Create(map[string]string{"STARTUP_DELAY": "2s"})
	host := h.Host(rec.ID, 8080)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.Docker.ContainerRemove(ctx, docker.ContainerName(rec.ID), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		s := h.State(rec.ID)
		return s == "killed", "state " + s
	})
	resp, body := h.Preview("GET", host, "/", nil, gatewaytest.APIHeader())
	if code, _ := jsonErrorCode(body); resp.StatusCode != http.StatusServiceUnavailable || code != "sandbox_killed" {
		t.Fatalf("API request to the killed sandbox before any wake: %d %s; want 503 sandbox_killed", resp.StatusCode, body)
	}

	since := time.Now()
	resp, body = h.Preview("POST", host, preview.PathWake, nil, gatewaytest.APIHeader())
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(body, `"waking": true`) {
		t.Fatalf("wake: %d %s; want 202 with waking true", resp.StatusCode, body)
	}
	const apis, pages = 8, 4
	type answer struct {
		page   bool
		status int
		body   string
		err    error
	}
	answers := make(chan answer, apis+pages)
	for i := range apis + pages {
		go func() {
			header := gatewaytest.APIHeader()
			if i >= apis {
				header = gatewaytest.BrowserHeader()
			}
			resp, body, err := h.PreviewErr("GET", host, "/", nil, header)
			if err != nil {
				answers <- answer{page: i >= apis, err: err}
				return
			}
			answers <- answer{page: i >= apis, status: resp.StatusCode, body: body}
		}()
	}
	warming := 0
	for range apis + pages {
		a := <-answers
		app := a.status == http.StatusOK && strings.Contains(a.body, "Hello from the sandbox")
		switch {
		case a.err != nil:
			t.Errorf("request during the recreate: %v", a.err)
		case !a.page && !app:
			t.Errorf("API request during the recreate: %d %.300q; want the app's 200", a.status, a.body)
		case a.page && a.status == http.StatusServiceUnavailable && pageKind(a.body) == preview.PageWarming:
			warming++
		case a.page && !app:
			t.Errorf("page load during the recreate: %d kind %q; want the warming page or the app", a.status, pageKind(a.body))
		}
	}
	t.Logf("%d of %d page loads got the warming page", warming, pages)
	// The app listens 2s after its start: page loads sent as the wake
	// began see the warming page, not the app.
	if warming == 0 {
		t.Errorf("no page load got the warming page during the recreate")
	}
	if s := h.State(rec.ID); s != "running" {
		t.Errorf("after the wake the sandbox is %s, want running", s)
	}
	if n := h.StartEvents(rec.ID, since); n != 1 {
		t.Errorf("%d docker starts, want 1 (every request joined the one recreate)", n)
	}
}
