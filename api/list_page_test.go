package api_test

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/chromedp/chromedp"

	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/store"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestListPages: GET /v1/sandboxes pages in id order with limit and
// cursor, filters by state and label, answers next only while there is
// more, and never gives a sandbox twice though one is created between
// pages; bad limits and cursors are 400s (the CLI's pages: cli's
// TestListPagesCLI).
func TestListPages(t *testing.T) {
	h := newHarness(t, "")
	var ids []string
	for i := range 5 {
		rec := h.Create(nil)
		ids = append(ids, rec.ID)
		if i%2 == 0 {
			h.Stop(rec.ID)
		}
	}
	slices.Sort(ids)
	var got []string
	var late, lateAfter string
	cursor := ""
	for n := 0; ; n++ {
		var page client.SandboxList // fresh: a last page has no next to overwrite an old one
		path := "/v1/sandboxes?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		if status := h.API("GET", path, nil, &page); status != 200 {
			t.Fatalf("GET %s: %d", path, status)
		}
		for _, s := range page.Sandboxes {
			if slices.Contains(got, s.ID) {
				t.Fatalf("%s on two pages", s.ID)
			}
			got = append(got, s.ID)
		}
		if n == 0 {
			// A sandbox created between pages comes on a later page,
			// once, if its id sorts after the cursor; never otherwise.
			late = h.Create(nil).ID
			lateAfter = page.Next
		}
		if page.Next == "" {
			break
		}
		if len(page.Sandboxes) != 2 || page.Next != page.Sandboxes[1].ID {
			t.Fatalf("page %+v next %q", len(page.Sandboxes), page.Next)
		}
		cursor = page.Next
	}
	want := slices.Clone(ids)
	if late > lateAfter {
		want = append(want, late)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("pages gave %v, want %v (created between pages: %s after %s)", got, want, late, lateAfter)
	}
	ids = append(ids, late)
	slices.Sort(ids)
	var stopped client.SandboxList
	h.API("GET", "/v1/sandboxes?state=stopped&limit=10", nil, &stopped)
	if len(stopped.Sandboxes) != 3 || stopped.Next != "" {
		t.Fatalf("stopped page: %d sandboxes, next %q", len(stopped.Sandboxes), stopped.Next)
	}
	var labelled client.SandboxList
	h.API("GET", "/v1/sandboxes?label="+testenv.LabelRun+"%3Dnope", nil, &labelled)
	if len(labelled.Sandboxes) != 0 {
		t.Fatalf("label filter kept %d", len(labelled.Sandboxes))
	}
	var e client.ErrorResponse
	for _, bad := range []string{"limit=0", "limit=1001", "limit=x", "cursor=NOT-AN-ID!", "label=novalue", "state=asleep"} {
		if status := h.API("GET", "/v1/sandboxes?"+bad, nil, &e); status != http.StatusBadRequest || e.Error.Code != "invalid" {
			t.Fatalf("?%s: %d %+v", bad, status, e)
		}
	}
}

// TestDashboardPagesInBrowser: with more sandboxes than a page, the
// dashboard shows the first page, the gateway's own counts of all of
// them, and adds a page per "Show more" until the last.
func TestDashboardPagesInBrowser(t *testing.T) {
	const n = 1200
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		// Records of sandboxes that are gone (killed: reconcile leaves
		// them), written before the gateway opens the store.
		st, err := store.Open(store.Options{Dir: filepath.Join(h.Dir, "sandwake")})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		for i := range n {
			rec := lifecycle.Record{ID: fmt.Sprintf("pg%05d", i), State: lifecycle.Killed, CreatedAt: now, StateSince: now, LastActiveAt: now,
				Spec: lifecycle.Spec{Image: "gone:1", Ports: []int{8080}, WorkspacePath: "/workspace", Access: lifecycle.AccessPublic}}
			if _, _, err := st.Create(rec, "test"); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return h.Caddyfile("")
	})
	srv := newDashboardServer(t, h, true)
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	rowsShown := func() int {
		return gatewaytest.Evaluate[int](t, ctx, `document.querySelectorAll("#rows tr[data-id]").length`)
	}
	gatewaytest.Browse(t, ctx, "signing in",
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(chromedp.ID("more-button")),
	)
	if got := rowsShown(); got != 500 {
		t.Fatalf("first page: %d rows, want 500", got)
	}
	if note := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("more-note").textContent`); note != fmt.Sprintf("Showing the first 500 of %d.", n) {
		t.Fatalf("more note: %q", note)
	}
	if sum := gatewaytest.Evaluate[string](t, ctx, `document.getElementById("summary").textContent`); !strings.HasPrefix(sum, fmt.Sprintf("%d sandboxes", n)) {
		t.Fatalf("summary: %q", sum)
	}
	for _, want := range []int{1000, n} {
		gatewaytest.Browse(t, ctx, "showing more",
			chromedp.Click(chromedp.ID("more-button")),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#rows tr[data-id="pg%05d"]`, want-1))),
		)
		if got := rowsShown(); got != want {
			t.Fatalf("after show more: %d rows, want %d", got, want)
		}
	}
	if hidden := gatewaytest.Evaluate[bool](t, ctx, `document.getElementById("more").hidden`); !hidden {
		t.Fatal("show more is offered after the last page")
	}
}
